/* The admin HTTP listener of a real ttd: /healthz, /readyz and /metrics in Prometheus text
 * format with values that follow what clients did; wrong paths and methods answered. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn/conn.h"
#include "suites.h"
#include "ttd_harness.h"

static ttd_proc proc;
static int port;

static void setup(void) { port = ttd_proc_start_admin(&proc); }

static void teardown(void) { ck_assert_int_eq(ttd_proc_stop(&proc), 0); }

/* One HTTP/1.0 request to the admin listener; the whole response, malloc'd. */
static char *http(const char *method, const char *path) { return harness_http(port, method, path); }

/* /healthz and /readyz answer 200; an unknown path 404; a POST 405. */
START_TEST(test_health_endpoints) {
  char *r = http("GET", "/healthz");
  ck_assert_ptr_nonnull(strstr(r, "200 OK"));
  ck_assert_ptr_nonnull(strstr(r, "\r\n\r\nok\n"));
  free(r);
  r = http("GET", "/readyz");
  ck_assert_ptr_nonnull(strstr(r, "200 OK"));
  free(r);
  r = http("GET", "/nope");
  ck_assert_ptr_nonnull(strstr(r, " 404 "));
  free(r);
  r = http("POST", "/metrics");
  ck_assert_ptr_nonnull(strstr(r, " 405 "));
  free(r);
}
END_TEST

/* /metrics reports memory per device and location, sessions, tensors, RPCs by method and
 * code, a latency histogram, and bytes moved each way, following a client's work. */
START_TEST(test_metrics_follow_work) {
  tt_client *c = harness_connect(&proc, 0);
  static float v[1 << 18];
  int64_t shape[1] = {1 << 18};
  tt_tensor *h = tt_tensor_from_host(c, v, TT_FLOAT32, shape, 1);
  tt_tensor *d = tt_to(h, "tt:1/l1");
  tt_tensor *back = tt_to(d, "cpu");
  ck_assert_ptr_null(tt_to(h, "tt:7"));
  int64_t huge[1] = {(int64_t)1 << 40};
  ck_assert_ptr_null(tt_tensor_empty(c, TT_FLOAT32, huge, 1, "tt"));
  char *r = http("GET", "/metrics");
  ck_assert_ptr_nonnull(strstr(r, "200 OK"));
  ck_assert_ptr_nonnull(strstr(r, "text/plain; version=0.0.4"));
  ck_assert_double_eq(harness_metric(r, "ttd_device_memory_used_bytes{device=\"tt:1\",location=\"l1\"}"), 1 << 20);
  ck_assert_double_eq(harness_metric(r, "ttd_device_memory_used_bytes{device=\"tt:0\",location=\"dram\"}"), 0);
  ck_assert_double_eq(harness_metric(r, "ttd_device_memory_in_flight_bytes{device=\"tt:1\",location=\"l1\"}"), 0);
  ck_assert_double_eq(harness_metric(r, "ttd_device_memory_capacity_bytes{device=\"tt:0\",location=\"dram\"}"), 12884901888.0);
  ck_assert_double_eq(harness_metric(r, "ttd_sessions"), 1);
  ck_assert_double_eq(harness_metric(r, "ttd_tensors"), 1);
  ck_assert_double_eq(harness_metric(r, "ttd_bytes_to_device_total"), 1 << 20);
  ck_assert_double_eq(harness_metric(r, "ttd_bytes_to_host_total"), 1 << 20);
  ck_assert_double_eq(harness_metric(r, "ttd_rpc_total{method=\"Upload\",code=\"OK\"}"), 1);
  ck_assert_double_eq(harness_metric(r, "ttd_rpc_total{method=\"Upload\",code=\"INVALID_ARGUMENT\"}"), 1);
  ck_assert_double_eq(harness_metric(r, "ttd_rpc_total{method=\"Allocate\",code=\"RESOURCE_EXHAUSTED\"}"), 1);
  ck_assert_double_eq(harness_metric(r, "ttd_rpc_total{method=\"OpenSession\",code=\"OK\"}"), 1);
  ck_assert_double_eq(harness_metric(r, "ttd_rpc_duration_seconds_count{method=\"Download\"}"), 1);
  ck_assert_double_eq(harness_metric(r, "ttd_rpc_duration_seconds_bucket{method=\"Download\",le=\"+Inf\"}"), 1);
  ck_assert(harness_metric(r, "ttd_rpc_duration_seconds_sum{method=\"Download\"}") > 0);
  ck_assert_double_eq(harness_metric(r, "ttd_rpc_in_flight"), 0);
  ck_assert_double_eq(harness_metric(r, "ttd_device_queue_depth{device=\"tt:0\"}"), 0);
  ck_assert_double_eq(harness_metric(r, "ttd_device_queue_depth{device=\"tt:1\"}"), 0);
  free(r);
  tt_tensor_free(back);
  tt_tensor_free(d);
  tt_tensor_free(h);
  tt_disconnect(c);
  r = http("GET", "/metrics");
  ck_assert_double_eq(harness_metric(r, "ttd_sessions"), 0);
  ck_assert_double_eq(harness_metric(r, "ttd_device_memory_used_bytes{device=\"tt:1\",location=\"l1\"}"), 0);
  ck_assert_double_eq(harness_metric(r, "ttd_device_memory_in_flight_bytes{device=\"tt:1\",location=\"l1\"}"), 0);
  ck_assert_double_eq(harness_metric(r, "ttd_rpc_total{method=\"CloseSession\",code=\"OK\"}"), 1);
  free(r);
}
END_TEST

/* Lists the devices `calls` times on c; the last list must match want (when given). */
static void list_devices(tt_client *c, int calls, const tt_device_info *want, size_t want_count) {
  for (int i = 0; i < calls; i++) {
    tt_device_info *devs = NULL;
    size_t n = 0;
    ck_assert_int_eq(tt_list_devices(c, &devs, &n), TT_OK);
    if (want) {
      ck_assert_uint_eq(n, want_count);
      for (size_t d = 0; d < n; d++) {
        ck_assert_str_eq(devs[d].name, want[d].name);
        ck_assert_str_eq(devs[d].kind, want[d].kind);
        ck_assert_uint_eq(devs[d].cores, want[d].cores);
        ck_assert_uint_eq(devs[d].dram.capacity_bytes, want[d].dram.capacity_bytes);
        ck_assert_uint_eq(devs[d].l1.used_bytes, want[d].l1.used_bytes);
      }
    }
    tt_device_list_free(devs);
  }
}

/* A client with disable_spin: it never polls for an answer. */
static tt_client *connect_quiet(void) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.disable_keepalive = 1;
  o.disable_spin = 1;
  tt_client *quiet = NULL;
  ck_assert_int_eq(tt_connect(proc.target, &o, &quiet), TT_OK);
  return quiet;
}

/* The client's window `spin` polled, and so did ttd's poller (ttd_<name>_*). */
static void check_spun(const ttd_cq_spin *spin, const char *name) {
  ck_assert_uint_gt(atomic_load(&spin->hits) + atomic_load(&spin->misses), 0);
  ck_assert_uint_gt(atomic_load(&spin->spin_ns), 0);
  char *r = http("GET", "/metrics"), metric[64];
  double polled = 0;
  const char *counts[] = {"hits", "misses"};
  for (int i = 0; i < 2; i++) {
    snprintf(metric, sizeof(metric), "ttd_%s_%s_total", name, counts[i]);
    polled += harness_metric(r, metric);
  }
  ck_assert(polled > 0);
  snprintf(metric, sizeof(metric), "ttd_%s_seconds_total", name);
  ck_assert(harness_metric(r, metric) > 0);
  free(r);
}

/* Light calls make the poller poll before it sleeps (ttd_poll_spin_*) and the client poll
 * for their answers; a client with disable_spin, or TTD_SPIN=0, never polls and gets the
 * same answers. */
START_TEST(test_poll_spin) {
  tt_client *c = harness_connect(&proc, 0);
  ck_assert_int_eq(c->spin.max_ns, TTD_CQ_SPIN_DEFAULT_US * 1000);
  ck_assert_int_eq(TTD_CQ_SPIN_DEFAULT_US, 1000);
  tt_device_info *first = NULL;
  size_t count = 0;
  ck_assert_int_eq(tt_list_devices(c, &first, &count), TT_OK);
  ck_assert_uint_eq(count, 2);
  list_devices(c, 30, first, count);
  check_spun(&c->spin, "poll_spin");

  tt_client *quiet = connect_quiet();
  ck_assert_int_eq(quiet->spin.max_ns, 0);
  list_devices(quiet, 30, first, count);
  ck_assert_uint_eq(atomic_load(&quiet->spin.hits) + atomic_load(&quiet->spin.misses) + atomic_load(&quiet->spin.spin_ns), 0);
  tt_disconnect(quiet);

  tt_connect_options o;
  tt_connect_options_init(&o);
  o.disable_keepalive = 1;
  setenv("TTD_SPIN", "0", 1);
  ck_assert_int_eq(tt_connect(proc.target, &o, &quiet), TT_OK);
  unsetenv("TTD_SPIN");
  ck_assert_int_eq(quiet->spin.max_ns, 0);
  list_devices(quiet, 5, first, count);
  tt_disconnect(quiet);
  tt_device_list_free(first);
  tt_disconnect(c);
}
END_TEST

/* Forward runs of a one-linear module on the card: n device calls (Execute). */
static void device_calls(tt_client *c, int n) {
  tt_graph *g = tt_graph_create(c, 7);
  int64_t xs[2] = {2, 3};
  tt_value x = tt_graph_input(g, "x", TT_FLOAT32, xs, 2);
  ck_assert_int_eq(tt_graph_output(g, tt_nn_linear(g, x, 2, 1)), 0);
  tt_module *m = tt_compile(c, g);
  tt_graph_free(g);
  ck_assert_ptr_nonnull(m);
  ck_assert_int_eq(tt_module_to(m, "tt"), TT_OK);
  tt_module_train(m, 0);
  tt_tensor *h = tt_tensor_from_host(c, NULL, TT_FLOAT32, xs, 2);
  memset(tt_tensor_data(h), 0, 6 * sizeof(float));
  tt_tensor *in = tt_to(h, "tt");
  for (int i = 0; i < n; i++) {
    tt_tensor *out = NULL;
    ck_assert_msg(tt_forward(m, &in, 1, &out) == TT_OK, "%s", tt_last_error(c));
    tt_tensor_free(out);
  }
  tt_tensor_free(in);
  tt_tensor_free(h);
  tt_module_free(m);
}

/* Where the card's time goes: TRAIN_STEPS training steps of linear then relu (its loss on the
 * CPU, its backward and SGD step riding on the next Execute) and one forward that carries the
 * last: /metrics counts every node by op and pass, two updates a step, one device call a
 * forward; the nodes' and updates' time lies inside the calls' running phase, and every phase
 * took time. */
enum { TRAIN_STEPS = 5 };
START_TEST(test_card_time) {
  tt_client *c = harness_connect(&proc, 0);
  harness_tiny_net net;
  harness_tiny_net_make(c, &net);
  tt_module *m = net.m;
  tt_tensor *in = net.in, *target = net.target;
  tt_optimizer *opt = tt_sgd(m, 0.1f, 0, 0, 0);
  ck_assert_ptr_nonnull(opt);
  for (int i = 0; i <= TRAIN_STEPS; i++) {
    tt_tensor *out = NULL;
    ck_assert_msg(tt_forward(m, &in, 1, &out) == TT_OK, "%s", tt_last_error(c));
    if (i < TRAIN_STEPS) {
      tt_tensor *y = tt_to(out, "cpu"), *loss = tt_l1_loss(y, target);
      ck_assert_ptr_nonnull(loss);
      ck_assert_int_eq(tt_zero_grad(opt), TT_OK);
      ck_assert_int_eq(tt_backward(loss), TT_OK);
      ck_assert_int_eq(tt_step(opt), TT_OK);
      tt_tensor_free(loss);
      tt_tensor_free(y);
    }
    tt_tensor_free(out);
  }
  char *r = http("GET", "/metrics");
  ck_assert_double_eq(harness_metric(r, "ttd_node_runs_total{op=\"linear\",pass=\"forward\"}"), TRAIN_STEPS + 1);
  ck_assert_double_eq(harness_metric(r, "ttd_node_runs_total{op=\"relu\",pass=\"forward\"}"), TRAIN_STEPS + 1);
  ck_assert_double_eq(harness_metric(r, "ttd_node_runs_total{op=\"linear\",pass=\"backward\"}"), TRAIN_STEPS);
  ck_assert_double_eq(harness_metric(r, "ttd_node_runs_total{op=\"relu\",pass=\"backward\"}"), TRAIN_STEPS);
  ck_assert_ptr_null(strstr(r, "op=\"matmul\"")); /* ops that never ran are not listed */
  ck_assert_double_eq(harness_metric(r, "ttd_optimizer_updates_total"), 2 * TRAIN_STEPS);
  ck_assert_double_eq(harness_metric(r, "ttd_device_calls_total"), TRAIN_STEPS + 1);
  double nodes = 0;
  const char *keys[] = {"ttd_node_seconds_total{op=\"linear\",pass=\"forward\"}",
                        "ttd_node_seconds_total{op=\"linear\",pass=\"backward\"}",
                        "ttd_node_seconds_total{op=\"relu\",pass=\"forward\"}",
                        "ttd_node_seconds_total{op=\"relu\",pass=\"backward\"}", "ttd_optimizer_seconds_total"};
  for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
    double s = harness_metric(r, keys[k]);
    ck_assert_msg(s > 0 && s < 10, "%s is %g", keys[k], s);
    nodes += s;
  }
  double waiting = harness_metric(r, "ttd_device_call_seconds_total{phase=\"waiting\"}");
  double running = harness_metric(r, "ttd_device_call_seconds_total{phase=\"running\"}");
  double answering = harness_metric(r, "ttd_device_call_seconds_total{phase=\"answering\"}");
  ck_assert_msg(waiting > 0 && answering > 0, "waiting %g s, answering %g s", waiting, answering);
  ck_assert_msg(running >= nodes && running < 10, "running %g s, the nodes and updates in it %g s", running, nodes);
  free(r);
  tt_optimizer_free(opt);
  harness_tiny_net_free(&net);
  tt_disconnect(c);
}
END_TEST

/* Device work: the client polls for its answer with a window of its own (up to 10 ms), the
 * poller for the next call after answering it (ttd_device_spin_*, --device-spin-us); the
 * client's disable_spin turns both of its windows off. */
START_TEST(test_device_spin) {
  tt_client *c = harness_connect(&proc, 0);
  ck_assert_int_eq(c->device_spin.max_ns, 10000LL * 1000);
  device_calls(c, 20);
  check_spun(&c->device_spin, "device_spin");
  tt_disconnect(c);

  tt_client *quiet = connect_quiet();
  ck_assert_int_eq(quiet->device_spin.max_ns, 0);
  device_calls(quiet, 5);
  ck_assert_uint_eq(atomic_load(&quiet->device_spin.hits) + atomic_load(&quiet->device_spin.misses) +
                        atomic_load(&quiet->device_spin.spin_ns), 0);
  tt_disconnect(quiet);
}
END_TEST

/* A ttd with `flag 0`: calls(client, 10) still work, answered 10 times (rpc_metric), and
 * ttd_<spin>_* stay at 0: its poller sleeps at once after them. */
static void check_spin_off(const char *flag, const char *spin, void (*calls)(tt_client *, int), const char *rpc_metric) {
  char admin[32], name[64];
  int off_port = harness_free_tcp_port();
  snprintf(admin, sizeof(admin), "127.0.0.1:%d", off_port);
  const char *args[] = {"--admin", admin, flag, "0", NULL};
  ttd_proc off;
  ttd_proc_start(&off, args);
  tt_client *c = harness_connect(&off, 0);
  calls(c, 10);
  tt_disconnect(c);
  char *r = harness_http(off_port, "GET", "/metrics");
  const char *suffixes[] = {"hits", "misses", "seconds"};
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof(name), "ttd_%s_%s_total", spin, suffixes[i]);
    ck_assert_double_eq(harness_metric(r, name), 0);
  }
  ck_assert_double_eq(harness_metric(r, rpc_metric), 10);
  free(r);
  ck_assert_int_eq(ttd_proc_stop(&off), 0);
}

static void light_calls(tt_client *c, int n) { list_devices(c, n, NULL, 0); }

/* ttd --spin-us 0, --device-spin-us 0: the poller sleeps at once after such calls. */
START_TEST(test_spin_off) {
  check_spin_off("--spin-us", "poll_spin", light_calls, "ttd_rpc_total{method=\"ListDevices\",code=\"OK\"}");
  check_spin_off("--device-spin-us", "device_spin", device_calls, "ttd_rpc_total{method=\"Execute\",code=\"OK\"}");
}
END_TEST

Suite *e2e_metrics_suite(void) {
  Suite *s = suite_create("e2e_metrics");
  TCase *tc = tcase_create("admin_http");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_health_endpoints);
  tcase_add_test(tc, test_metrics_follow_work);
  tcase_add_test(tc, test_poll_spin);
  tcase_add_test(tc, test_device_spin);
  tcase_add_test(tc, test_card_time);
  tcase_add_test(tc, test_spin_off);
  suite_add_tcase(s, tc);
  return s;
}
