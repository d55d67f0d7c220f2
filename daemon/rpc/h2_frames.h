/* HTTP/2 frames as a client sends them, counted before gRPC parses them: the TLS relay
 * (conn_relay.h) and the read guard of plain-text connections (h2_read_guard.h) feed each
 * chunk of a peer's bytes through a parser and pass them on only while the verdict is
 * TTD_H2_PASS. It reads the 24-byte client preface and then each
 * frame's 9-byte header (length, type, flags, stream), skipping payloads; no HPACK. Pure: no
 * I/O, no clock (the caller passes the time), no allocation.
 *
 * Frame lengths are gRPC's to check: it refuses a frame longer than the SETTINGS_MAX_FRAME_SIZE
 * the client has acknowledged, which gRPC raises at run time as its flow control grows
 * (BDP probing: from 4 MiB - 1 up to 16 MiB), so no fixed bound here would be right. Streams
 * are gRPC's too once the client has acknowledged the server's SETTINGS (its
 * MAX_CONCURRENT_STREAMS, 1024, then holds); before that gRPC holds a client to no bound at
 * all, so the parser allows TTD_H2_STREAMS_BEFORE_ACK new streams until the first SETTINGS
 * acknowledgement that follows the server's first write (ttd_h2_frames_server_spoke): gRPC
 * applies an acknowledgement to the SETTINGS it has sent, and one that comes before them
 * acknowledges gRPC's defaults, which bound nothing. */
#ifndef TTD_RPC_H2_FRAMES_H
#define TTD_RPC_H2_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#define TTD_H2_PREFACE_LEN 24
#define TTD_H2_FRAME_HEADER_LEN 9

/* "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", the client preface (with a terminating NUL). */
extern const uint8_t ttd_h2_preface[TTD_H2_PREFACE_LEN + 1];
#define TTD_H2_HEADERS 1
#define TTD_H2_RST_STREAM 3
#define TTD_H2_SETTINGS 4
#define TTD_H2_FLAG_ACK 1
/* Streams a client may open before it acknowledges the server's SETTINGS: gRPC's
 * MAX_CONCURRENT_STREAMS, which a client that read them keeps to. */
#define TTD_H2_STREAMS_BEFORE_ACK 1024

typedef enum ttd_h2_verdict {
  TTD_H2_PASS,            /* every byte so far may go on to gRPC */
  TTD_H2_BAD_PREFACE,     /* the first 24 bytes are not the HTTP/2 client preface */
  TTD_H2_RESET_FLOOD,     /* RST_STREAM frames past the bucket (HTTP/2 rapid reset) */
  TTD_H2_STREAM_FLOOD,    /* more than TTD_H2_STREAMS_BEFORE_ACK streams before a SETTINGS ACK */
  TTD_H2_NO_CALL,         /* no stream opened in time: a caller's verdict (the TLS relay's), never the parser's */
} ttd_h2_verdict;

/* One connection's client-to-server direction. Plain data: copy, no destroy. */
typedef struct ttd_h2_frames {
  uint32_t preface_seen;   /* bytes of the preface read, up to TTD_H2_PREFACE_LEN */
  uint8_t head[TTD_H2_FRAME_HEADER_LEN];
  uint32_t head_len;       /* bytes of the current frame header read */
  uint32_t payload_left;   /* bytes of the current frame's payload still to skip */
  int64_t reset_millis;    /* the reset bucket, in thousandths of a reset */
  int64_t reset_depth;     /* its depth in thousandths: max_resets * 1000 */
  int max_resets;          /* a second, and the bucket's depth */
  int64_t resets_ms;       /* when the bucket was last filled */
  uint64_t frames;         /* whole frame headers read */
  uint64_t resets;         /* RST_STREAM frames read */
  uint32_t last_stream;    /* the highest stream a HEADERS frame opened */
  uint32_t streams_unacked; /* streams opened before the first SETTINGS acknowledgement */
  int server_spoke;        /* the server has written to the client (its SETTINGS first) */
  int settings_acked;      /* the client acknowledged the server's SETTINGS */
  uint64_t offset;         /* bytes fed */
  uint64_t head_at;        /* the offset of the current frame header's first byte */
  uint64_t good;           /* bytes that may go on: all fed while PASS, else up to the frame
                            * (or preface) that turned the verdict */
  ttd_h2_verdict verdict;  /* sticky: once not PASS, feeding changes nothing */
} ttd_h2_frames;

/* A parser at the start of a connection (the preface is next), its bucket full: max_resets
 * RST_STREAM frames at once, then max_resets a second. expect_preface false starts at a frame
 * header (for callers that checked the preface themselves). */
void ttd_h2_frames_init(ttd_h2_frames *f, int max_resets, int expect_preface, int64_t now_ms);

/* Reads len more bytes of the client's stream, received at now_ms (a monotonic clock in
 * milliseconds); returns the verdict so far. data may be NULL when len is 0. */
ttd_h2_verdict ttd_h2_frames_feed(ttd_h2_frames *f, const uint8_t *data, size_t len, int64_t now_ms);

/* The server has written to the client: its SETTINGS, which gRPC writes first, are out, so a
 * SETTINGS acknowledgement from now on is one of them. */
void ttd_h2_frames_server_spoke(ttd_h2_frames *f);

/* What a verdict means, for logs: "HTTP/2 rapid reset" and the like. */
const char *ttd_h2_verdict_text(ttd_h2_verdict v);

#endif
