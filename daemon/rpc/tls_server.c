#include "rpc/tls_server.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

/* ALPN: HTTP/2 or nothing. */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *out_len, const unsigned char *in,
                       unsigned int in_len, void *arg) {
  static const unsigned char h2[] = {2, 'h', '2'};
  unsigned char *chosen = NULL;
  if (SSL_select_next_proto(&chosen, out_len, h2, sizeof(h2), in, in_len) != OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

/* Adds every PEM certificate of text after the first to ctx's chain (ca false: cert's
 * chain), or every one to its trust store and the CA names it sends clients (ca true). */
static bool add_pem_certificates(SSL_CTX *ctx, const char *text, bool ca) {
  BIO *bio = BIO_new_mem_buf(text, -1);
  if (!bio) return false;
  bool ok = true;
  int count = 0;
  STACK_OF(X509_NAME) *names = ca ? sk_X509_NAME_new_null() : NULL;
  for (X509 *x; (x = PEM_read_bio_X509(bio, NULL, NULL, NULL)); count++) {
    if (ca) {
      ok &= X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), x) == 1;
      X509_NAME *name = names ? X509_NAME_dup(X509_get_subject_name(x)) : NULL;
      if (name && sk_X509_NAME_push(names, name) <= 0) X509_NAME_free(name);
      X509_free(x);
    } else if (count == 0) {
      X509_free(x); /* the leaf: set by the caller */
    } else if (SSL_CTX_add0_chain_cert(ctx, x) != 1) {
      X509_free(x);
      ok = false;
    }
  }
  ERR_clear_error(); /* the end of the text */
  BIO_free(bio);
  if (names) SSL_CTX_set_client_CA_list(ctx, names);
  return ok;
}

ttd_status_t ttd_tls_server_context(const char *cert, const char *key, const char *ca, SSL_CTX **out) {
  *out = NULL;
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  BIO *text = BIO_new_mem_buf(cert, -1);
  X509 *leaf = text ? PEM_read_bio_X509(text, NULL, NULL, NULL) : NULL;
  BIO_free(text);
  BIO *bio = BIO_new_mem_buf(key, -1);
  EVP_PKEY *pkey = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
  BIO_free(bio);
  bool ok = ctx && leaf && pkey && SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) == 1 &&
            SSL_CTX_use_certificate(ctx, leaf) == 1 && SSL_CTX_use_PrivateKey(ctx, pkey) == 1 &&
            add_pem_certificates(ctx, cert, false) && (!ca || add_pem_certificates(ctx, ca, true));
  X509_free(leaf);
  EVP_PKEY_free(pkey);
  if (!ok) {
    char why[160] = "?";
    ERR_error_string_n(ERR_peek_last_error(), why, sizeof(why));
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "TLS could not be set up from --tls-cert, --tls-key and "
                           "--tls-client-ca: %s", why);
  }
  SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
  if (ca) SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  /* Partial writes: the relay writes what the socket takes and retries the rest. Buffers
   * released while a connection is idle. No renegotiation; no session resumption, which
   * gRPC's clients do not use. */
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  *out = ctx;
  return TTD_OK;
}

SSL *ttd_tls_server_session(SSL_CTX *ctx, int fd) {
  SSL *ssl = SSL_new(ctx);
  BIO *in = BIO_new_socket(fd, BIO_NOCLOSE), *out = BIO_new(BIO_s_mem());
  if (!ssl || !in || !out) {
    BIO_free(in);
    BIO_free(out);
    SSL_free(ssl);
    ERR_clear_error();
    return NULL;
  }
  SSL_set_bio(ssl, in, out);
  SSL_set_accept_state(ssl);
  return ssl;
}

/* Sends what the handshake wrote to memory: 1 when all of it is gone, 0 when the socket is
 * full, -1 when it failed. */
static int send_written(SSL *ssl, int fd) {
  BIO *out = SSL_get_wbio(ssl);
  char *data;
  long len;
  while ((len = BIO_get_mem_data(out, &data)) > 0) {
    ssize_t n = send(fd, data, (size_t)len, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    char sink[4096];
    for (ssize_t left = n; left > 0;) {
      int k = BIO_read(out, sink, left < (ssize_t)sizeof(sink) ? (int)left : (int)sizeof(sink));
      if (k <= 0) return -1;
      left -= k;
    }
  }
  return 1;
}

/* A refusal: the client's bytes read (so that the close is orderly), the reason in why. */
static ttd_tls_step refuse(int fd, char *why, size_t why_size, const char *reason) {
  char sink[4096];
  for (int i = 0; i < 16 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++) {
  }
  snprintf(why, why_size, "%s", reason);
  ERR_clear_error();
  return TTD_TLS_FAILED;
}

ttd_tls_step ttd_tls_server_handshake(SSL *ssl, int fd, char *why, size_t why_size) {
  if (!SSL_is_init_finished(ssl)) {
    ERR_clear_error();
    int rc = SSL_do_handshake(ssl);
    int err = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl, rc);
    if (err != SSL_ERROR_NONE && err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
      char reason[160] = "the peer closed the connection";
      unsigned long e = ERR_peek_error();
      if (e) ERR_error_string_n(e, reason, sizeof(reason));
      return refuse(fd, why, why_size, reason);
    }
  }
  int sent = send_written(ssl, fd);
  if (sent < 0) return refuse(fd, why, why_size, "the peer closed the connection");
  if (sent == 0) return TTD_TLS_WANT_WRITE;
  if (!SSL_is_init_finished(ssl)) return TTD_TLS_WANT_READ;
  const unsigned char *alpn = NULL;
  unsigned alpn_len = 0;
  SSL_get0_alpn_selected(ssl, &alpn, &alpn_len);
  if (alpn_len != 2 || memcmp(alpn, "h2", 2) != 0) {
    return refuse(fd, why, why_size, "the client did not offer HTTP/2 (ALPN h2)");
  }
  BIO *out = BIO_new_socket(fd, BIO_NOCLOSE);
  if (!out) return refuse(fd, why, why_size, "out of memory");
  SSL_set0_wbio(ssl, out); /* from here the session writes to the socket */
  return TTD_TLS_DONE;
}
