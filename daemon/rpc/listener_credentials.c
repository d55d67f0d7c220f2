#include "rpc/listener_credentials.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/tls_server.h"
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
  if (!status) status = ttd_tls_server_context(cert, key, ca, out);
  if (key) memset(key, 0, strlen(key));
  free(cert);
  free(key);
  free(ca);
  return status;
}

