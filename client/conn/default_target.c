/* tt_default_target: the runtime's default address, the one ttd listens on when told nothing. */
#include "ttclient.h"
#include "wire/address.h"

int tt_default_target(char *buf, size_t len) { return ttd_default_address(buf, len); }
