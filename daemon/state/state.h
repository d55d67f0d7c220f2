/* Layer daemon/state: the daemon's saved state (ttd --state-dir). Calls daemon/core and
 * the layers below it.
 *
 * Training survives a graceful restart: at a stop, after the server has drained, every open
 * session is written to DIR/state/ (its tensors, with parameters' gradients and optimizer
 * state, its compiled programs and its kept runs); at start they are read back and wait for
 * their clients to resume them with the secret OpenSession gave (ttd_session_table_resume).
 *
 * The files (their messages are in proto/ttd/v1/ttd.proto, "Saved state"):
 *   DIR/state/MANIFEST            SavedState: format, writer, and each session's two files
 *                                 with their sizes and CRC-32s
 *   DIR/state/ID.session          SavedSession: metadata, handles, programs, runs
 *   DIR/state/ID.safetensors      the session's tensors' bytes, named t0, t1, ...
 * A save writes DIR/state.new/ whole, fsynced, then swaps it for DIR/state/ in one rename;
 * a stop that dies midway leaves the previous state untouched. A session's state files are
 * removed as soon as it is resumed or ends, so that a crash never brings back a session
 * whose state moved on; a resumed session's data file moves to DIR/spare/ instead, and its
 * next save writes over it in place, because blocks a file system frees are trimmed (ext4's
 * discard) and writing fresh ones costs several times more on thinly provisioned disks. The
 * spare goes when its session ends, and at the next start. Everything is readable by the
 * daemon's user only. */
#ifndef TTD_STATE_H
#define TTD_STATE_H

#include "core/core.h"

#define TTD_STATE_FORMAT 1

typedef struct ttd_state ttd_state;

/* Opens dir for core: creates it (mode 0700) if missing; refuses (FAILED_PRECONDITION,
 * saying what to fix) one that is not a directory of this user or that others may
 * enter. Reads DIR/state/ back: its sessions join core's table, awaiting resume. State
 * that is torn, of another format or unsafe is never half-loaded: it is moved aside to
 * DIR/refused-TIME/, logged, and nothing is resumed. Sessions of tenants the tokens file no
 * longer names, or that no longer fit their quota or the cards, are skipped and logged. */
ttd_status_t ttd_state_open(ttd_core *core, const char *dir, ttd_state **out_state);

/* Writes every session of the core's table to DIR/state/, replacing what was there in one
 * rename. For the stop, once no call runs. */
ttd_status_t ttd_state_save(ttd_state *state);

/* Accepts NULL. The state files stay; DIR/spare/ goes. */
void ttd_state_close(ttd_state *state);

#endif
