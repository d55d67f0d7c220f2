/* What every fault client shares: connecting with its tenant's token, and dying loudly. */
#include <stdlib.h>

#include "faults.h"

tt_client *fc_connect(const fc_args *a, int keepalive) {
  tt_connect_options o;
  tt_connect_options_init(&o);
  o.client_name = a->role;
  o.disable_shm = !a->shm;
  o.disable_keepalive = !keepalive;
  tt_client *c = NULL;
  if (tt_connect(a->target, &o, &c) != TT_OK) fc_die(c, "tt_connect");
  return c;
}

void fc_die(tt_client *c, const char *what) {
  ft_report(FT_MSG_EVENT, c ? (int)tt_errcode(c) : TT_RESOURCE_EXHAUSTED, c ? tt_session_id(c) : 0, NULL, "%s: %s",
            what, tt_last_error(c));
  exit(1);
}
