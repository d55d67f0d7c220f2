/* daemon/config.h: defaults, flags in both forms, sizes and durations, bounds and unknown
 * options, --help, config text and --config FILE (flags win), repeatable --listen, clear. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/config.h"
#include "suites.h"

static ttd_config cfg;
static char tmp_path[64];

static void setup(void) {
  ttd_config_defaults(&cfg);
  tmp_path[0] = '\0';
}

static void teardown(void) {
  ttd_config_clear(&cfg);
  if (tmp_path[0]) unlink(tmp_path);
}

/* Writes text to a fresh temporary file; its path is left in tmp_path (removed in teardown). */
static const char *write_temp_file(const char *text) {
  snprintf(tmp_path, sizeof(tmp_path), "/tmp/ttd-config-test-XXXXXX");
  int fd = mkstemp(tmp_path);
  ck_assert_msg(fd >= 0, "mkstemp: %s", strerror(errno));
  size_t len = strlen(text);
  ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
  close(fd);
  return tmp_path;
}

/* Runs ttd_config_load on a NULL-terminated argument list (argv[0] is added). */
static ttd_status_t load_args(ttd_config_action *out_help, const char *const *args) {
  char *argv[32];
  int argc = 0;
  argv[argc++] = "ttd";
  for (; *args; args++) argv[argc++] = (char *)*args;
  argv[argc] = NULL;
  return ttd_config_load(&cfg, argc, argv, out_help);
}
#define LOAD(help, ...) load_args((help), (const char *const[]){__VA_ARGS__, NULL})

/* Asserts s is INVALID_ARGUMENT and its message contains every given fragment; frees s.
 * line is the caller's, for the failure message. */
static void expect_invalid(int line, ttd_status_t s, const char *const *fragments) {
  ck_assert_msg(s != NULL, "line %d: expected INVALID_ARGUMENT, got OK", line);
  ck_assert_msg(ttd_status_code(s) == GRPC_STATUS_INVALID_ARGUMENT, "line %d: expected INVALID_ARGUMENT, got %s: %s",
                line, ttd_code_name(ttd_status_code(s)), ttd_status_message(s));
  for (; *fragments; fragments++) {
    ck_assert_msg(strstr(ttd_status_message(s), *fragments) != NULL, "line %d: message '%s' lacks '%s'", line,
                  ttd_status_message(s), *fragments);
  }
  ttd_status_free(s);
}
#define EXPECT_INVALID(s, ...) expect_invalid(__LINE__, (s), (const char *const[]){__VA_ARGS__, NULL})

/* Defaults: 4 threads, 1 device, 12 GiB DRAM, 108 MiB L1, 30 s lease, sim backend, no listen. */
START_TEST(test_defaults) {
  ck_assert_int_eq(cfg.threads, 4);
  ck_assert_int_eq(cfg.spin_us, 1000);
  ck_assert_int_eq(cfg.device_spin_us, 2000);
  ck_assert_int_eq(cfg.devices, 1);
  ck_assert_uint_eq(cfg.dram, 12ull << 30);
  ck_assert_uint_eq(cfg.l1, 108ull << 20);
  ck_assert_int_eq(cfg.lease_ms, 30000);
  ck_assert_int_eq(cfg.drain_timeout_ms, 10000);
  ck_assert_int_eq(cfg.cores, 0);
  ck_assert_int_eq(cfg.programs_at_once, 0);
  ck_assert_str_eq(cfg.backend, "sim");
  ck_assert_str_eq(cfg.log_level, "info");
  ck_assert_int_eq(cfg.listen_count, 0);
  ck_assert_ptr_null(cfg.config_file);
}
END_TEST

/* Loading no arguments keeps every default and sets no help. */
START_TEST(test_load_no_args) {
  char *argv[] = {"ttd", NULL};
  ttd_config_action help = 7;
  ck_assert_ptr_null(ttd_config_load(&cfg, 1, argv, &help));
  ck_assert_int_eq(help, 0);
  ck_assert_int_eq(cfg.threads, 4);
  ck_assert_uint_eq(cfg.dram, 12ull << 30);
}
END_TEST

/* Flags work both as `--name value` and `--name=value`. */
START_TEST(test_flag_forms) {
  ttd_config_action help = 1;
  ttd_status_t s = LOAD(&help, "--threads", "8", "--devices=3", "--dram", "1G", "--l1=2M", "--lease", "500ms",
                        "--drain-timeout=2s", "--cores", "16", "--log-level=debug", "--backend", "sim");
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_int_eq(help, 0);
  ck_assert_int_eq(cfg.threads, 8);
  ck_assert_int_eq(cfg.devices, 3);
  ck_assert_uint_eq(cfg.dram, 1ull << 30);
  ck_assert_uint_eq(cfg.l1, 2ull << 20);
  ck_assert_int_eq(cfg.lease_ms, 500);
  ck_assert_int_eq(cfg.drain_timeout_ms, 2000);
  ck_assert_int_eq(cfg.cores, 16);
  ck_assert_str_eq(cfg.log_level, "debug");
  ck_assert_str_eq(cfg.backend, "sim");
}
END_TEST

/* A later flag overrides an earlier one; `--name=` with an '=' in the value keeps the rest. */
START_TEST(test_flag_last_wins) {
  ttd_config_action help;
  ttd_status_t s = LOAD(&help, "--threads=2", "--threads", "9", "--listen=unix:/tmp/a=b.sock");
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_int_eq(cfg.threads, 9);
  ck_assert_int_eq(cfg.listen_count, 1);
  ck_assert_str_eq(cfg.listen[0], "unix:/tmp/a=b.sock");
}
END_TEST

/* Sizes accept plain bytes and K/M/G/T with optional i and B, either case. */
START_TEST(test_parse_size) {
  static const struct { const char *text; uint64_t bytes; } ok[] = {
      {"0", 0},           {"4096", 4096},          {"1K", 1024},         {"1k", 1024},
      {"1KiB", 1024},     {"1KB", 1024},           {"1kib", 1024},       {"512M", 512ull << 20},
      {"512MiB", 512ull << 20}, {"12G", 12ull << 30}, {"12GB", 12ull << 30}, {"1T", 1ull << 40},
      {"2TiB", 2ull << 40}, {"100B", 100},         {"18446744073709551615", UINT64_MAX},
      {"16777215T", 16777215ull << 40},
  };
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    uint64_t v = 12345;
    ck_assert_msg(ttd_config_parse_size(ok[i].text, &v) == 0, "'%s' refused", ok[i].text);
    ck_assert_msg(v == ok[i].bytes, "'%s' -> %llu", ok[i].text, (unsigned long long)v);
  }
}
END_TEST

/* Malformed and overflowing sizes are refused and leave the output alone. */
START_TEST(test_parse_size_bad) {
  static const char *const bad[] = {"", "K", "-1", "+5", " 5", "1X", "1.5G", "1GG", "1 G", "1iB", "1Ki B",
                                    "0x10", "18446744073709551616", "16777216T", "17179869184G", "12Gx"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    uint64_t v = 777;
    ck_assert_msg(ttd_config_parse_size(bad[i], &v) == -1, "'%s' accepted as %llu", bad[i],
                  (unsigned long long)v);
    ck_assert_uint_eq(v, 777);
  }
}
END_TEST

/* Durations: plain numbers are seconds, s and ms suffixes, fractions. */
START_TEST(test_parse_duration) {
  static const struct { const char *text; int64_t ms; } ok[] = {
      {"30", 30000}, {"30s", 30000}, {"500ms", 500}, {"0.5", 500}, {"0", 0},
      {"1.5s", 1500}, {"0ms", 0},    {"86400", 86400000}, {"2.25", 2250},
  };
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    int64_t v = -5;
    ck_assert_msg(ttd_config_parse_duration_ms(ok[i].text, &v) == 0, "'%s' refused", ok[i].text);
    ck_assert_msg(v == ok[i].ms, "'%s' -> %lld ms", ok[i].text, (long long)v);
  }
}
END_TEST

/* Malformed, negative and non-finite durations are refused. */
START_TEST(test_parse_duration_bad) {
  static const char *const bad[] = {"", "s", "ms", "-1", "-0.5s", "5m", "5h", "5 s", "5sec", "inf", "nan",
                                    "1e300", "abc", "10mss"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int64_t v = 4242;
    ck_assert_msg(ttd_config_parse_duration_ms(bad[i], &v) == -1, "'%s' accepted as %lld", bad[i],
                  (long long)v);
    ck_assert_int_eq(v, 4242);
  }
}
END_TEST

/* Values at the bounds are accepted. */
START_TEST(test_bounds_edges_ok) {
  static const char *const pairs[][2] = {
      {"threads", "1"}, {"threads", "256"}, {"devices", "1"}, {"devices", "64"}, {"cores", "0"},
      {"cores", "1024"}, {"lease", "50ms"}, {"lease", "86400"}, {"drain-timeout", "0"},
      {"drain-timeout", "3600s"}, {"dram", "0"}, {"l1", "8T"}, {"dram", "9223372036854775807"},
      {"spin-us", "0"}, {"spin-us", "10000"}, {"programs-at-once", "0"}, {"programs-at-once", "64"},
  };
  for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
    ttd_status_t s = ttd_config_set(&cfg, pairs[i][0], pairs[i][1]);
    ck_assert_msg(s == NULL, "%s=%s: %s", pairs[i][0], pairs[i][1], ttd_status_message(s));
  }
  ck_assert_int_eq(cfg.threads, 256);
  ck_assert_int_eq(cfg.spin_us, 10000);
  ck_assert_int_eq(cfg.devices, 64);
  ck_assert_int_eq(cfg.cores, 1024);
  ck_assert_int_eq(cfg.programs_at_once, 64);
  ck_assert_int_eq(cfg.lease_ms, 86400000);
  ck_assert_int_eq(cfg.drain_timeout_ms, 3600000);
  ck_assert_uint_eq(cfg.l1, 8ull << 40);
  ck_assert_uint_eq(cfg.dram, 9223372036854775807ull);
}
END_TEST

/* Out of bounds or malformed values are INVALID_ARGUMENT naming the option; the value stays. */
START_TEST(test_bounds_errors) {
  static const char *const pairs[][2] = {
      {"threads", "0"},  {"threads", "257"},   {"threads", "abc"}, {"threads", "4x"},  {"threads", ""},
      {"threads", "99999999999999999999"}, {"devices", "0"}, {"devices", "65"}, {"cores", "-1"},
      {"cores", "1025"}, {"lease", "10ms"},   {"lease", "49ms"},  {"lease", "86401"}, {"lease", "soon"},
      {"drain-timeout", "3601"}, {"dram", "12Q"}, {"dram", "-1"},  {"l1", "9223372036854775808"},
      {"spin-us", "-1"}, {"spin-us", "10001"}, {"spin-us", "50us"}, {"device-spin-us", "-1"},
      {"device-spin-us", "100001"}, {"programs-at-once", "-1"}, {"programs-at-once", "65"},
  };
  for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
    char flag[32];
    snprintf(flag, sizeof(flag), "--%s", pairs[i][0]);
    EXPECT_INVALID(ttd_config_set(&cfg, pairs[i][0], pairs[i][1]), flag);
  }
  ck_assert_int_eq(cfg.threads, 4);
  ck_assert_int_eq(cfg.spin_us, 1000);
  ck_assert_int_eq(cfg.device_spin_us, 2000);
  ck_assert_int_eq(cfg.devices, 1);
  ck_assert_int_eq(cfg.cores, 0);
  ck_assert_int_eq(cfg.programs_at_once, 0);
  ck_assert_int_eq(cfg.lease_ms, 30000);
  ck_assert_int_eq(cfg.drain_timeout_ms, 10000);
  ck_assert_uint_eq(cfg.dram, 12ull << 30);
  ck_assert_uint_eq(cfg.l1, 108ull << 20);
}
END_TEST

/* A bad flag value through ttd_config_load names the flag and quotes the value. */
START_TEST(test_load_bad_value) {
  ttd_config_action help;
  EXPECT_INVALID(LOAD(&help, "--threads", "1000"), "--threads", "1000");
  EXPECT_INVALID(LOAD(&help, "--lease=1ms"), "--lease", "1ms");
  EXPECT_INVALID(LOAD(&help, "--dram", "lots"), "--dram", "lots");
}
END_TEST

/* An unknown option is INVALID_ARGUMENT naming it, as a flag and by name. */
START_TEST(test_unknown_option) {
  ttd_config_action help;
  EXPECT_INVALID(LOAD(&help, "--bogus", "1"), "--bogus");
  EXPECT_INVALID(LOAD(&help, "--threads", "2", "--bogus=1"), "--bogus");
  EXPECT_INVALID(LOAD(&help, "--thread", "2"), "--thread"); /* prefixes are not options */
  EXPECT_INVALID(ttd_config_set(&cfg, "bogus", "1"), "bogus");
  EXPECT_INVALID(ttd_config_set(&cfg, "", "1"), "unknown option");
}
END_TEST

/* A positional argument or single-dash option is refused with a hint. */
START_TEST(test_positional_refused) {
  ttd_config_action help;
  EXPECT_INVALID(LOAD(&help, "serve"), "serve", "--");
  EXPECT_INVALID(LOAD(&help, "-threads", "2"), "-threads");
}
END_TEST

/* A flag with no value at the end of the line is INVALID_ARGUMENT naming it. */
START_TEST(test_missing_value) {
  ttd_config_action help;
  EXPECT_INVALID(LOAD(&help, "--threads"), "--threads", "needs a value");
  EXPECT_INVALID(LOAD(&help, "--devices", "2", "--listen"), "--listen", "needs a value");
  EXPECT_INVALID(LOAD(&help, "--config"), "--config", "needs a value");
}
END_TEST

/* --help (or -h) and --version win over anything else on the line, bad flags included. */
START_TEST(test_help) {
  ttd_config_action help = TTD_CONFIG_RUN;
  ck_assert_ptr_null(LOAD(&help, "--help"));
  ck_assert_int_eq(help, TTD_CONFIG_HELP);
  help = TTD_CONFIG_RUN;
  ck_assert_ptr_null(LOAD(&help, "--threads", "0", "--bogus", "-h"));
  ck_assert_int_eq(help, TTD_CONFIG_HELP);
  ck_assert_ptr_null(LOAD(&help, "--bogus", "--version"));
  ck_assert_int_eq(help, TTD_CONFIG_VERSION);
  help = TTD_CONFIG_HELP;
  ck_assert_ptr_null(LOAD(&help, "--threads", "3"));
  ck_assert_int_eq(help, TTD_CONFIG_RUN);
}
END_TEST

/* A reload names exactly the changed options that take a restart; --tokens, --quota and
 * --config apply at once and are never named. */
START_TEST(test_restart_changes) {
  ttd_config running, fresh;
  ttd_config_defaults(&running);
  ttd_config_defaults(&fresh);
  const char *names[TTD_CONFIG_MAX_OPTIONS];
  ck_assert_int_eq(ttd_config_restart_changes(&running, &fresh, names, TTD_CONFIG_MAX_OPTIONS), 0);
  ck_assert_ptr_null(ttd_config_set(&running, "listen", "unix:/tmp/a.sock"));
  ck_assert_ptr_null(ttd_config_set(&fresh, "listen", "unix:/tmp/a.sock"));
  ck_assert_ptr_null(ttd_config_set(&fresh, "quota", "1G"));
  ck_assert_ptr_null(ttd_config_set(&fresh, "tokens", "/etc/ttd/tokens"));
  ck_assert_int_eq(ttd_config_restart_changes(&running, &fresh, names, TTD_CONFIG_MAX_OPTIONS), 0);
  ck_assert_ptr_null(ttd_config_set(&fresh, "threads", "7"));
  ck_assert_ptr_null(ttd_config_set(&fresh, "admin", "off"));
  ck_assert_ptr_null(ttd_config_set(&fresh, "listen", "unix:/tmp/b.sock")); /* a second listener */
  ck_assert_int_eq(ttd_config_restart_changes(&running, &fresh, names, TTD_CONFIG_MAX_OPTIONS), 3);
  ck_assert_str_eq(names[0], "listen");
  ck_assert_str_eq(names[1], "threads");
  ck_assert_str_eq(names[2], "admin");
  ck_assert_int_eq(ttd_config_restart_changes(&running, &fresh, names, 1), 1); /* bounded by max */
  ttd_config_clear(&running);
  ttd_config_clear(&fresh);
}
END_TEST

/* A reload that drops --tokens while a TCP listener (bound at start, kept until a restart)
 * is guarded by nothing else is refused naming the listener, even when the new listen list
 * has no TCP address; with tokens kept, mutual TLS or --insecure running, it goes through. */
START_TEST(test_reload_keeps_network_listeners_authenticated) {
  ttd_config running, fresh;
  ttd_config_defaults(&running);
  ttd_config_defaults(&fresh);
  ck_assert_ptr_null(ttd_config_set(&running, "listen", "127.0.0.1:7000"));
  ck_assert_ptr_null(ttd_config_set(&running, "tokens", "/etc/ttd/tokens"));
  ck_assert_ptr_null(ttd_config_set(&fresh, "listen", "unix:/tmp/a.sock"));
  ttd_status_t s = ttd_config_check_reload(&running, &fresh);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "would leave listener 127.0.0.1:7000 serving without "
                                                      "authentication"));
  ttd_status_free(s);
  ck_assert_ptr_null(ttd_config_set(&fresh, "tokens", "/etc/ttd/tokens2"));
  ck_assert_ptr_null(ttd_config_check_reload(&running, &fresh));
  ttd_config_clear(&fresh);
  ttd_config_defaults(&fresh);
  ck_assert_ptr_null(ttd_config_set(&running, "insecure", "true"));
  ck_assert_ptr_null(ttd_config_check_reload(&running, &fresh));
  ttd_config_clear(&running);
  ttd_config_clear(&fresh);
}
END_TEST

/* An abstract socket without tokens is refused at start even with mutual TLS, which guards
 * TCP only, and the message does not suggest it; with --insecure it starts, and TCP with
 * mutual TLS still does. A reload that drops --tokens while such a socket serves under
 * mutual TLS is refused too. */
START_TEST(test_abstract_socket_needs_tokens_despite_mtls) {
  ttd_config c;
  ttd_config_defaults(&c);
  ck_assert_ptr_null(ttd_config_set(&c, "listen", "unix-abstract:ttd-test"));
  ck_assert_ptr_null(ttd_config_set(&c, "tls-cert", "/etc/ttd/c.pem"));
  ck_assert_ptr_null(ttd_config_set(&c, "tls-key", "/etc/ttd/k.pem"));
  ck_assert_ptr_null(ttd_config_set(&c, "tls-client-ca", "/etc/ttd/ca.pem"));
  ttd_status_t s = ttd_config_check(&c);
  ck_assert_int_eq(ttd_status_code(s), GRPC_STATUS_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "listener unix-abstract:ttd-test is not guarded"));
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "mutual TLS does not guard an abstract socket"));
  ck_assert_ptr_null(strstr(ttd_status_message(s), "with --tls-client-ca"));
  ttd_status_free(s);
  ttd_config fresh;
  ttd_config_defaults(&fresh);
  ck_assert_ptr_null(ttd_config_set(&c, "tokens", "/etc/ttd/tokens"));
  ck_assert_ptr_null(ttd_config_check(&c));
  s = ttd_config_check_reload(&c, &fresh);
  ck_assert_ptr_nonnull(strstr(ttd_status_message(s), "would leave listener unix-abstract:ttd-test serving"));
  ttd_status_free(s);
  ck_assert_ptr_null(ttd_config_set(&c, "insecure", "true"));
  ck_assert_ptr_null(ttd_config_check_reload(&c, &fresh));
  ttd_config_clear(&c);
  ttd_config_clear(&fresh);
  ttd_config_defaults(&c);
  ck_assert_ptr_null(ttd_config_set(&c, "listen", "127.0.0.1:7000"));
  ck_assert_ptr_null(ttd_config_set(&c, "tls-cert", "/etc/ttd/c.pem"));
  ck_assert_ptr_null(ttd_config_set(&c, "tls-key", "/etc/ttd/k.pem"));
  ck_assert_ptr_null(ttd_config_set(&c, "tls-client-ca", "/etc/ttd/ca.pem"));
  ck_assert_ptr_null(ttd_config_check(&c));
  ttd_config_clear(&c);
}
END_TEST

/* Usage lists every option with its default, and says what holds: without tokens callers are
 * the tenant 'local' (admin rights only by peer credentials), and a running kernel stops. */
START_TEST(test_usage) {
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  ttd_config_usage(out);
  fclose(out);
  static const char *const names[] = {"--listen", "--threads", "--spin-us", "--backend", "--devices", "--dram", "--l1",
                                      "--cores", "--programs-at-once", "--lease", "--drain-timeout", "--log-level", "--config",
                                      "--help", "12G", "108M"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    ck_assert_msg(strstr(text, names[i]) != NULL, "usage lacks %s", names[i]);
  }
  ck_assert_ptr_null(strstr(text, "admin tenant 'local'"));
  ck_assert_ptr_null(strstr(text, "nothing can stop"));
  ck_assert_ptr_nonnull(strstr(text, "admin rights only for ttd's own user and root on a Unix socket file"));
  ck_assert_ptr_nonnull(strstr(text, "stops within a chunk of its kernel"));
  free(text);
}
END_TEST

/* Config text: `name = value` lines, comments, blank lines, whitespace and CRLF. */
START_TEST(test_apply_text) {
  const char *text = "# ttd.conf\n"
                     "threads = 7\n"
                     "\n"
                     "   dram=2G   # trailing comment\n"
                     "l1 = 1MiB\r\n"
                     "lease = 2s\n"
                     "\t\n"
                     "log-level = warn\n"
                     "listen = unix:/tmp/a.sock\n"
                     "listen = localhost:5000";
  ttd_status_t s = ttd_config_apply_text(&cfg, text, "test.conf");
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_int_eq(cfg.threads, 7);
  ck_assert_uint_eq(cfg.dram, 2ull << 30);
  ck_assert_uint_eq(cfg.l1, 1ull << 20);
  ck_assert_int_eq(cfg.lease_ms, 2000);
  ck_assert_str_eq(cfg.log_level, "warn");
  ck_assert_int_eq(cfg.listen_count, 2);
  ck_assert_str_eq(cfg.listen[0], "unix:/tmp/a.sock");
  ck_assert_str_eq(cfg.listen[1], "localhost:5000");
  ck_assert_int_eq(cfg.devices, 1); /* untouched */
}
END_TEST

/* Empty text and comment-only text change nothing. */
START_TEST(test_apply_text_empty) {
  ck_assert_ptr_null(ttd_config_apply_text(&cfg, "", "empty.conf"));
  ck_assert_ptr_null(ttd_config_apply_text(&cfg, "# nothing\n\n   \n", "empty.conf"));
  ck_assert_int_eq(cfg.threads, 4);
}
END_TEST

/* Errors in config text name source:line and the option. */
START_TEST(test_apply_text_errors) {
  EXPECT_INVALID(ttd_config_apply_text(&cfg, "threads = 2\nthreads = 0\n", "a.conf"), "a.conf:2:", "--threads");
  EXPECT_INVALID(ttd_config_apply_text(&cfg, "threads = 2\njust words\n", "b.conf"), "b.conf:2:", "just words");
  EXPECT_INVALID(ttd_config_apply_text(&cfg, "# c\nbogus = 1\n", "c.conf"), "c.conf:2:", "bogus");
  EXPECT_INVALID(ttd_config_apply_text(&cfg, "config = other.conf\n", "d.conf"), "d.conf:1:");
}
END_TEST

/* Line numbers in config text errors count blank and comment lines too. */
START_TEST(test_apply_text_error_line_after_blanks) {
  EXPECT_INVALID(ttd_config_apply_text(&cfg, "threads = 2\n\n\n# x\n\ndevices = 99\n", "e.conf"), "e.conf:6:",
                 "--devices");
  EXPECT_INVALID(ttd_config_apply_text(&cfg, "\nnonsense\n", "f.conf"), "f.conf:2:");
}
END_TEST

/* --config FILE applies the file; flags win over it wherever they stand on the line. */
START_TEST(test_config_file_flags_win) {
  const char *path = write_temp_file("threads = 9\ndevices = 2\nlease = 5s\nlog-level = debug\n");
  ttd_config_action help;
  ttd_status_t s = LOAD(&help, "--devices", "5", "--config", path, "--log-level=error");
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_int_eq(cfg.threads, 9);     /* from the file */
  ck_assert_int_eq(cfg.lease_ms, 5000); /* from the file */
  ck_assert_int_eq(cfg.devices, 5);     /* flag before --config still wins */
  ck_assert_str_eq(cfg.log_level, "error");
  ck_assert_str_eq(cfg.config_file, path);
}
END_TEST

/* --config=FILE works too. */
START_TEST(test_config_file_eq_form) {
  const char *path = write_temp_file("dram = 3G\n");
  char arg[128];
  snprintf(arg, sizeof(arg), "--config=%s", path);
  ttd_config_action help;
  ttd_status_t s = LOAD(&help, arg);
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_uint_eq(cfg.dram, 3ull << 30);
}
END_TEST

/* An error in the config file names file:line. */
START_TEST(test_config_file_error_names_line) {
  const char *path = write_temp_file("threads = 2\ndevices = 999\n");
  char where[96];
  snprintf(where, sizeof(where), "%s:2:", path);
  ttd_config_action help;
  EXPECT_INVALID(LOAD(&help, "--config", path), where, "--devices");
}
END_TEST

/* A config file error is reported with the right line even after blank and comment lines. */
START_TEST(test_config_file_error_after_blank_lines) {
  const char *path = write_temp_file("# header\n\nthreads = 2\n\n\nlease = forever\n");
  char where[96];
  snprintf(where, sizeof(where), "%s:6:", path);
  ttd_config_action help;
  EXPECT_INVALID(LOAD(&help, "--config", path), where, "--lease");
}
END_TEST

/* A missing config file is INVALID_ARGUMENT naming the path. */
START_TEST(test_config_file_missing) {
  ttd_config_action help;
  EXPECT_INVALID(LOAD(&help, "--config", "/nonexistent/ttd-test.conf"), "/nonexistent/ttd-test.conf");
}
END_TEST

/* A directory given as the config file is INVALID_ARGUMENT naming it, not an empty file. */
START_TEST(test_config_file_directory) {
  ttd_config_action help;
  EXPECT_INVALID(LOAD(&help, "--config", "/tmp"), "/tmp");
}
END_TEST

/* A config file others may write is refused, naming who and how to fix it (as sshd refuses
 * one); one only its owner writes is read; ttd_file_world_readable tells o+r apart. */
START_TEST(test_config_file_writable_by_others) {
  const char *path = write_temp_file("threads = 3\n");
  ttd_config_action help;
  ck_assert_int_eq(chmod(path, 0666), 0);
  EXPECT_INVALID(LOAD(&help, "--config", path), "is writable by everyone (mode 0666)");
  ck_assert_int_eq(chmod(path, 0660), 0);
  EXPECT_INVALID(LOAD(&help, "--config", path), "writable by its group (mode 0660): whoever can write it decides what "
                                                "ttd trusts; run chmod go-w on it");
  ck_assert_int_eq(chmod(path, 0644), 0);
  ck_assert_int_eq(ttd_file_world_readable(path), 1);
  ck_assert_ptr_null(LOAD(&help, "--config", path));
  ck_assert_int_eq(cfg.threads, 3);
  ck_assert_int_eq(chmod(path, 0640), 0);
  ck_assert_int_eq(ttd_file_world_readable(path), 0);
}
END_TEST

/* An empty config file is fine and changes nothing. */
START_TEST(test_config_file_empty) {
  const char *path = write_temp_file("");
  ttd_config_action help;
  ck_assert_ptr_null(LOAD(&help, "--config", path));
  ck_assert_int_eq(cfg.threads, 4);
}
END_TEST

/* --listen is repeatable and keeps the order given. */
START_TEST(test_listen_repeatable) {
  ttd_config_action help;
  ttd_status_t s = LOAD(&help, "--listen", "unix:/tmp/1.sock", "--listen=localhost:1", "--listen", "[::1]:2");
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_int_eq(cfg.listen_count, 3);
  ck_assert_str_eq(cfg.listen[0], "unix:/tmp/1.sock");
  ck_assert_str_eq(cfg.listen[1], "localhost:1");
  ck_assert_str_eq(cfg.listen[2], "[::1]:2");
}
END_TEST

/* More than TTD_CONFIG_MAX_LISTEN addresses is INVALID_ARGUMENT naming --listen. */
START_TEST(test_listen_too_many) {
  for (int i = 0; i < TTD_CONFIG_MAX_LISTEN; i++) ck_assert_ptr_null(ttd_config_set(&cfg, "listen", "unix:/x"));
  EXPECT_INVALID(ttd_config_set(&cfg, "listen", "unix:/y"), "--listen");
  ck_assert_int_eq(cfg.listen_count, TTD_CONFIG_MAX_LISTEN);
}
END_TEST

/* --listen flags replace the file's list; without --listen flags the file's list stays. */
START_TEST(test_listen_flags_replace_file) {
  const char *path = write_temp_file("listen = unix:/from/file1\nlisten = unix:/from/file2\n");
  ttd_config_action help;
  ttd_status_t s = LOAD(&help, "--listen", "unix:/flag/a", "--config", path, "--listen=unix:/flag/b");
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_int_eq(cfg.listen_count, 2);
  ck_assert_str_eq(cfg.listen[0], "unix:/flag/a");
  ck_assert_str_eq(cfg.listen[1], "unix:/flag/b");
  ttd_config_clear(&cfg);

  ttd_config_defaults(&cfg);
  s = LOAD(&help, "--config", path, "--threads", "2");
  ck_assert_msg(s == NULL, "%s", ttd_status_message(s));
  ck_assert_int_eq(cfg.listen_count, 2);
  ck_assert_str_eq(cfg.listen[0], "unix:/from/file1");
  ck_assert_str_eq(cfg.listen[1], "unix:/from/file2");
}
END_TEST

/* clear frees every string and zeroes the struct; clearing twice is safe (ASan checks leaks). */
START_TEST(test_clear) {
  ck_assert_ptr_null(ttd_config_set(&cfg, "listen", "unix:/a"));
  ck_assert_ptr_null(ttd_config_set(&cfg, "listen", "unix:/b"));
  ck_assert_ptr_null(ttd_config_set(&cfg, "backend", "sim"));
  ck_assert_ptr_null(ttd_config_set(&cfg, "backend", "sim2")); /* replaces, frees the old copy */
  ck_assert_ptr_null(ttd_config_set(&cfg, "log-level", "debug"));
  ck_assert_ptr_null(ttd_config_set(&cfg, "config", "/etc/ttd.conf"));
  ttd_config_clear(&cfg);
  ck_assert_int_eq(cfg.listen_count, 0);
  ck_assert_ptr_null(cfg.listen[0]);
  ck_assert_ptr_null(cfg.backend);
  ck_assert_ptr_null(cfg.log_level);
  ck_assert_ptr_null(cfg.config_file);
  ck_assert_int_eq(cfg.threads, 0);
  ttd_config_clear(&cfg);
}
END_TEST

Suite *config_suite(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("values");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_load_no_args);
  tcase_add_test(tc, test_parse_size);
  tcase_add_test(tc, test_parse_size_bad);
  tcase_add_test(tc, test_parse_duration);
  tcase_add_test(tc, test_parse_duration_bad);
  tcase_add_test(tc, test_bounds_edges_ok);
  tcase_add_test(tc, test_bounds_errors);
  tcase_add_test(tc, test_clear);
  suite_add_tcase(s, tc);

  tc = tcase_create("flags");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_flag_forms);
  tcase_add_test(tc, test_flag_last_wins);
  tcase_add_test(tc, test_load_bad_value);
  tcase_add_test(tc, test_unknown_option);
  tcase_add_test(tc, test_positional_refused);
  tcase_add_test(tc, test_missing_value);
  tcase_add_test(tc, test_help);
  tcase_add_test(tc, test_restart_changes);
  tcase_add_test(tc, test_reload_keeps_network_listeners_authenticated);
  tcase_add_test(tc, test_usage);
  tcase_add_test(tc, test_abstract_socket_needs_tokens_despite_mtls);
  tcase_add_test(tc, test_listen_repeatable);
  tcase_add_test(tc, test_listen_too_many);
  suite_add_tcase(s, tc);

  tc = tcase_create("file");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_apply_text);
  tcase_add_test(tc, test_apply_text_empty);
  tcase_add_test(tc, test_apply_text_errors);
  tcase_add_test(tc, test_apply_text_error_line_after_blanks);
  tcase_add_test(tc, test_config_file_flags_win);
  tcase_add_test(tc, test_config_file_eq_form);
  tcase_add_test(tc, test_config_file_error_names_line);
  tcase_add_test(tc, test_config_file_error_after_blank_lines);
  tcase_add_test(tc, test_config_file_missing);
  tcase_add_test(tc, test_config_file_directory);
  tcase_add_test(tc, test_config_file_writable_by_others);
  tcase_add_test(tc, test_config_file_empty);
  tcase_add_test(tc, test_listen_flags_replace_file);
  suite_add_tcase(s, tc);
  return s;
}
