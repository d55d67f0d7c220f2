#define _GNU_SOURCE /* pthread_setname_np */
#include "rpc/listener_probe.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "rpc/conn_gate.h"
#include "rpc/h2_frames.h"
#include "telemetry/log.h"

struct ttd_listener_probe {
  ttd_core *core;
  pthread_t thread;
  atomic_bool stopping;
  atomic_int port; /* the TCP source port of the probe's connection now, 0 before the first */
};


static void set_timeouts(int fd) {
  struct timeval tv = {TTD_PROBE_TIMEOUT_MS / 1000, (TTD_PROBE_TIMEOUT_MS % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* A socket connected to address (blocking, with the probe's timeouts), or -1. */
static int probe_connect(ttd_listener_probe *p, const char *address) {
  int fd = -1;
  if (strncmp(address, "unix:", 5) == 0 || strncmp(address, "unix-abstract:", 14) == 0) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    bool abstract = address[4] == '-';
    const char *name = abstract ? address + 14 : address + 5;
    size_t len = strlen(name);
    if (len + 2 > sizeof(sa.sun_path)) return -1;
    memcpy(sa.sun_path + (abstract ? 1 : 0), name, len);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    set_timeouts(fd);
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (abstract ? 1 : 0));
    if (connect(fd, (struct sockaddr *)&sa, sl) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }
  struct addrinfo *ai = NULL;
  ttd_status_t status = ttd_conn_gate_resolve(address, &ai);
  if (status) {
    ttd_status_free(status);
    return -1;
  }
  /* A wildcard address is probed on the loopback of its family. */
  if (ai->ai_family == AF_INET) {
    struct sockaddr_in *in = (struct sockaddr_in *)ai->ai_addr;
    if (in->sin_addr.s_addr == htonl(INADDR_ANY)) in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (ai->ai_family == AF_INET6) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ai->ai_addr;
    if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr)) in6->sin6_addr = in6addr_loopback;
  }
  fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    set_timeouts(fd);
    struct sockaddr_storage local = {.ss_family = (sa_family_t)ai->ai_family};
    socklen_t ll = ai->ai_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    bind(fd, (struct sockaddr *)&local, ll); /* an ephemeral port, known before connect */
    if (getsockname(fd, (struct sockaddr *)&local, &ll) == 0) {
      atomic_store(&p->port, ntohs(((struct sockaddr_in *)&local)->sin_port)); /* same offset in _in6 */
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  return fd;
}

/* Whether the plain-text listener answers the client preface with its SETTINGS. */
static bool probe_plain(int fd) {
  static const unsigned char settings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
  if (send(fd, ttd_h2_preface, TTD_H2_PREFACE_LEN, MSG_NOSIGNAL) != TTD_H2_PREFACE_LEN) return false;
  if (send(fd, settings, sizeof(settings), MSG_NOSIGNAL) != (ssize_t)sizeof(settings)) return false;
  unsigned char head[9];
  size_t got = 0;
  while (got < sizeof(head)) {
    ssize_t n = recv(fd, head + got, sizeof(head) - got, 0);
    if (n <= 0) return false;
    got += (size_t)n;
  }
  return head[3] == 4; /* SETTINGS */
}

/* Whether the TLS listener answers a ClientHello at all (a ServerHello or an alert): it
 * accepted the connection; the handshake need not succeed (mutual TLS wants a certificate). */
static bool probe_tls(int fd) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  SSL *ssl = ctx ? SSL_new(ctx) : NULL;
  bool answered = false;
  if (ssl) {
    SSL_set_verify(ssl, SSL_VERIFY_NONE, NULL);
    SSL_set_fd(ssl, fd);
    SSL_connect(ssl);
    answered = BIO_number_read(SSL_get_rbio(ssl)) > 0;
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ERR_clear_error();
  return answered;
}

static void *probe_main(void *arg) {
  ttd_listener_probe *p = arg;
  pthread_setname_np(pthread_self(), "ttd-probe");
  const ttd_config *config = p->core->config;
  unsigned down_logged = 0;
  while (!atomic_load(&p->stopping)) {
    unsigned down = 0;
    for (int i = 0; i < config->listen_count && i < 32 && !atomic_load(&p->stopping); i++) {
      const char *address = config->listen[i];
      bool tls = strncmp(address, "unix", 4) != 0 && config->tls_cert;
      int fd = probe_connect(p, address);
      bool up = fd >= 0 && (tls ? probe_tls(fd) : probe_plain(fd));
      if (fd >= 0) close(fd);
      if (!up) down |= 1u << i;
      if (!up && !(down_logged & (1u << i))) {
        TTD_LOG(TTD_LOG_ERROR, "event=listener-down address=%s reason=\"it did not answer a connection within %d ms\"",
                address, TTD_PROBE_TIMEOUT_MS);
      } else if (up && (down_logged & (1u << i))) {
        TTD_LOG(TTD_LOG_INFO, "event=listener-up address=%s", address);
      }
    }
    down_logged = down;
    atomic_store(&p->core->metrics.listeners_down, down);
    for (int slept = 0; slept < TTD_PROBE_MS && !atomic_load(&p->stopping); slept += 50) {
      struct timespec ts = {0, 50 * 1000000};
      nanosleep(&ts, NULL);
    }
  }
  return NULL;
}

ttd_status_t ttd_listener_probe_start(ttd_core *core, ttd_listener_probe **out_probe) {
  *out_probe = NULL;
  ttd_listener_probe *p = calloc(1, sizeof(*p));
  if (!p) return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory for the listener prober");
  p->core = core;
  if (pthread_create(&p->thread, NULL, probe_main, p) != 0) {
    free(p);
    return ttd_make_status(GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot start the listener prober's thread");
  }
  *out_probe = p;
  return TTD_OK;
}

int ttd_listener_probe_port(const ttd_listener_probe *p) {
  return p ? atomic_load(&((ttd_listener_probe *)p)->port) : 0;
}

void ttd_listener_probe_stop(ttd_listener_probe *p) {
  if (!p) return;
  atomic_store(&p->stopping, true);
  pthread_join(p->thread, NULL);
  free(p);
}
