/* The client's last error, the SQLite way: a call returns a code and tt_last_error says
 * what to fix. Each thread keeps its own, as errno: a call's message is read by the thread
 * that made it, whatever other threads do on the same client meanwhile. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "conn/conn.h"

/* This thread's last error, and the client (its error_key) it came from. */
static _Thread_local struct {
  uint64_t key;
  tt_status code;
  char msg[sizeof(((tt_client *)0)->errmsg)];
} last;

static atomic_uint_fast64_t next_key = 1;

void tt_client_error_init(tt_client *client) { client->error_key = atomic_fetch_add(&next_key, 1); }

/* tt_status is the protocol's code, so its names are the runtime's. */
const char *tt_status_name(tt_status status) { return ttd_code_name((ttd_code)status); }

tt_status tt_client_fail(tt_client *client, tt_status code, const char *fmt, ...) {
  char msg[sizeof(last.msg)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap); /* fmt's arguments may be this thread's last message */
  va_end(ap);
  memcpy(last.msg, msg, sizeof(msg));
  last.code = code;
  last.key = client->error_key;
  pthread_mutex_lock(&client->error_lock);
  client->errcode = code;
  memcpy(client->errmsg, msg, sizeof(msg));
  pthread_mutex_unlock(&client->error_lock);
  return code;
}

tt_status tt_client_fail_status(tt_client *client, ttd_status_t status) {
  tt_status code = tt_client_fail(client, (tt_status)ttd_status_code(status), "%s", ttd_status_message(status));
  ttd_status_free(status);
  return code;
}

tt_status tt_errcode(const tt_client *client) {
  if (!client) return TT_RESOURCE_EXHAUSTED;
  return last.key == client->error_key ? last.code : client->errcode;
}

const char *tt_last_error(const tt_client *client) {
  if (!client) return "out of memory";
  return last.key == client->error_key ? last.msg : client->errmsg;
}
