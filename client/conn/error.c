/* The client's last error, the SQLite way: a call returns a code and tt_last_error says
 * what to fix. */
#include <stdarg.h>
#include <stdio.h>

#include "conn/conn.h"

/* tt_status is the protocol's code, so its names are the runtime's. */
const char *tt_status_name(tt_status status) { return ttd_code_name((ttd_code)status); }

tt_status tt_client_fail(tt_client *client, tt_status code, const char *fmt, ...) {
  pthread_mutex_lock(&client->error_lock);
  client->errcode = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(client->errmsg, sizeof(client->errmsg), fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&client->error_lock);
  return code;
}

tt_status tt_client_fail_status(tt_client *client, ttd_status_t status) {
  tt_status code = tt_client_fail(client, (tt_status)ttd_status_code(status), "%s", ttd_status_message(status));
  ttd_status_free(status);
  return code;
}

tt_status tt_errcode(const tt_client *client) { return client ? client->errcode : TT_RESOURCE_EXHAUSTED; }

const char *tt_last_error(const tt_client *client) { return client ? client->errmsg : "out of memory"; }
