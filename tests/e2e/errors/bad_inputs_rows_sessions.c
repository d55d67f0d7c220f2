/* Bad-input rows of the session RPCs (OpenSession, KeepAlive, ListDevices, CloseSession) and of
 * the admin RPCs (ListSessions, KillSession): the first and the last of the hand-written table. */
#include <stdint.h>

#include "bad_inputs.h"

const bad_row bad_inputs_session_rows[] = {
    /* OpenSession */
    ROW(WRONG_TYPE, "OpenSession", AS_ALICE_BARE, "client_name sent as a varint (wrong wire type)", INVALID_ARGUMENT,
        "not a valid ttd.v1.OpenSessionRequest", RAW("\x08\x01")),
    ROW(WRONG_TYPE, "OpenSession", AS_ALICE_BARE, "a ListDevicesRequest: protocol_version left 0", FAILED_PRECONDITION,
        "the client speaks ttd.v1 protocol 0, this daemon speaks 1", RAW("")),
    ROW(OPTIONS, "OpenSession", AS_CAROL_BARE, "quota_bytes 2^64-1, past tenant carol's 1 MiB", RESOURCE_EXHAUSTED,
        "at most 1.00 MiB", .msg = {OPEN(.protocol_version = 1, .quota_bytes = UINT64_MAX)}),

    /* KeepAlive, CloseSession, ListDevices: requests without fields */
    ROW(WRONG_TYPE, "KeepAlive", AS_ALICE, "an AllocateRequest: unknown fields are skipped, as protobuf does", OK,
        NULL, .msg = {ALLOCATE(.dtype = F32, SHAPE(4))}),
    ROW(WRONG_TYPE, "ListDevices", AS_ALICE_BARE, "a FreeRequest: unknown fields are skipped", OK, NULL,
        .msg = {FREE(1, 2, 3)}),
    ROW(WRONG_TYPE, "CloseSession", AS_ALICE, "a length-delimited field cut short", INVALID_ARGUMENT,
        "not a valid ttd.v1.CloseSessionRequest", RAW("\x0a\x20\x08\x01")),
};
const size_t bad_inputs_session_rows_count = sizeof(bad_inputs_session_rows) / sizeof(bad_inputs_session_rows[0]);

const bad_row bad_inputs_admin_rows[] = {
    /* ListSessions and KillSession (admin only; e2e_tenants has bob refused both) */
    ROW(WRONG_TYPE, "ListSessions", AS_ADMIN, "garbage bytes as the request", INVALID_ARGUMENT,
        "not a valid ttd.v1.ListSessionsRequest", RAW("\xff\xff\xff\xff\x0f")),
    ROW(WRONG_TYPE, "KillSession", AS_ADMIN, "a FreeRequest: packed handles where a fixed64 is", INVALID_ARGUMENT,
        "not a valid ttd.v1.KillSessionRequest", .msg = {FREE(1, 2)}),
    ROW(HANDLE_LISTS, "KillSession", AS_ADMIN, "session 0", NOT_FOUND, "session 0000000000000000 is not open",
        .msg = {KILL(0)}),
    ROW(FOREIGN, "KillSession", AS_ADMIN, "a tensor handle as the session", NOT_FOUND, "is not open",
        .msg = {KILL(H(T_F32))}),
    ROW(FOREIGN, "KillSession", AS_ADMIN, "daemon B's session", NOT_FOUND, "is not open", .msg = {KILL(H(DB_S))}),
};
const size_t bad_inputs_admin_rows_count = sizeof(bad_inputs_admin_rows) / sizeof(bad_inputs_admin_rows[0]);
