#include "rpc/listener_credentials.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "telemetry/log.h"

/* The first PEM certificate of text, or NULL. */
static X509 *pem_certificate(const char *text) {
  BIO *bio = BIO_new_mem_buf(text, -1);
  X509 *x = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
  BIO_free(bio);
  return x;
}

/* gRPC takes any text for a certificate or key and fails later, when the port is added,
 * with no reason given: each file is parsed here, and the key must match the certificate,
 * so the error names the file to fix. */
static ttd_status_t check_tls_files(const ttd_config *config, const char *cert, const char *key, const char *ca) {
  ttd_status_t status = TTD_OK;
  X509 *x = pem_certificate(cert);
  BIO *bio = BIO_new_mem_buf(key, -1);
  EVP_PKEY *pkey = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
  BIO_free(bio);
  X509 *authority = ca ? pem_certificate(ca) : NULL;
  if (!x) {
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--tls-cert %s holds no PEM certificate", config->tls_cert);
  } else if (!pkey) {
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "--tls-key %s holds no PEM private key (or it is encrypted: ttd needs it unencrypted)",
                             config->tls_key);
  } else if (X509_check_private_key(x, pkey) != 1) {
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--tls-key %s is not the key of the certificate in --tls-cert %s",
                             config->tls_key, config->tls_cert);
  } else if (ca && !authority) {
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--tls-client-ca %s holds no PEM certificate",
                             config->tls_client_ca);
  }
  X509_free(authority);
  EVP_PKEY_free(pkey);
  X509_free(x);
  ERR_clear_error();
  return status;
}

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

/* Adds every PEM certificate of text after the first to ctx's chain (leaf false), or to its
 * trust store and the list of CAs it names to clients (leaf true: a CA bundle). */
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

/* The TLS context of the TCP listeners, from PEM texts check_tls_files accepted. */
static ttd_status_t make_tls_context(const char *cert, const char *key, const char *ca, SSL_CTX **out) {
  *out = NULL;
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  X509 *leaf = pem_certificate(cert);
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

ttd_status_t ttd_listener_credentials(const ttd_config *config, const char *address, SSL_CTX **out) {
  *out = NULL;
  if (strncmp(address, "unix:", 5) == 0 || strncmp(address, "unix-abstract:", 14) == 0) return TTD_OK;
  if (!config->tls_cert && !config->tls_key) {
    if (!config->insecure) {
      return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT,
                             "TCP listener %s needs TLS: pass --tls-cert and --tls-key (and --tls-client-ca for "
                             "mutual TLS), or --insecure for plain text on a trusted network", address);
    }
    TTD_LOG(TTD_LOG_WARN, "event=insecure-listener address=%s reason=\"--insecure: tokens and tensors cross the "
            "network in plain text\"", address);
    return TTD_OK;
  }
  if (!config->tls_cert || !config->tls_key) {
    return ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "TLS needs both --tls-cert and --tls-key");
  }
  char *cert = NULL, *key = NULL, *ca = NULL;
  ttd_status_t status = ttd_read_text_file(config->tls_cert, "TLS certificate", &cert);
  if (!status) status = ttd_read_text_file(config->tls_key, "TLS key", &key);
  if (!status && ttd_file_world_readable(config->tls_key)) {
    TTD_LOG(TTD_LOG_WARN, "event=unsafe-file file=%s what=\"TLS key\" problem=\"readable by everyone: chmod o-r it\"",
            config->tls_key);
  }
  if (!status && config->tls_client_ca) status = ttd_read_text_file(config->tls_client_ca, "TLS client CA", &ca);
  if (!status && (!strstr(cert, "-----BEGIN") || !strstr(key, "-----BEGIN") || (ca && !strstr(ca, "-----BEGIN")))) {
    status = ttd_make_status(GRPC_STATUS_INVALID_ARGUMENT, "--tls-cert, --tls-key and --tls-client-ca must be PEM files");
  }
  if (!status) status = check_tls_files(config, cert, key, ca);
  if (!status) status = make_tls_context(cert, key, ca, out);
  if (key) memset(key, 0, strlen(key));
  free(cert);
  free(key);
  free(ca);
  return status;
}

