/* What saving and loading the state share: the folder, the file names, and checked,
 * checksummed file I/O relative to an open folder. */
#ifndef TTD_STATE_FILES_H
#define TTD_STATE_FILES_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "state/state.h"
#include "ttd/v1/ttd.pb-c.h"

struct ttd_state {
  ttd_core *core;
  char *dir;  /* as configured */
  int dir_fd; /* DIR, open */
  int lock_fd; /* DIR/lock, flock'ed: one ttd a state folder */
  int spare_fd; /* DIR/spare, open: resumed sessions' data files, kept for their next save */
  pthread_mutex_t files_lock; /* over the sessions' on_disk and the files it says they have */
};

#define TTD_STATE_CURRENT "state"
#define TTD_STATE_NEXT "state.new"
#define TTD_STATE_MANIFEST "MANIFEST"
#define TTD_STATE_LOCK "lock"
#define TTD_STATE_SPARE "spare"

/* Tensors a backend cannot show the host move through a buffer of this size. */
#define BOUNCE_BYTES (4u << 20)

/* "ID.session" / "ID.safetensors" for session id. */
void ttd_state_file_name(char *buf, size_t size, uint64_t session_id, const char *suffix);

/* A file being written in a folder: every byte counted, and checksummed unless it is a
 * data file (sized, and checked whole by its header, but its gigabytes not summed). */
typedef struct ttd_state_writer {
  int fd;
  const char *name;
  uint64_t bytes;
  uint32_t crc;
  bool checksum;
} ttd_state_writer;

ttd_status_t ttd_state_writer_open(ttd_state_writer *w, int dir_fd, const char *name, bool checksum);
/* As ttd_state_writer_open, but over the file of that name in from_fd, moved into dir_fd and
 * written in place: its blocks are reused rather than freed and allocated again. A new file
 * where from_fd has none, or none that is a private regular file with one link. */
ttd_status_t ttd_state_writer_open_over(ttd_state_writer *w, int from_fd, int dir_fd, const char *name);
ttd_status_t ttd_state_writer_put(ttd_state_writer *w, const void *data, uint64_t len);
/* Cuts the file to the bytes written, fsyncs and closes; fills file (name, bytes, crc32)
 * when not NULL. Closes on error too. */
ttd_status_t ttd_state_writer_finish(ttd_state_writer *w, Ttd__V1__SavedFile *file);

/* Writes a whole small file (a packed message), synced. */
ttd_status_t ttd_state_write_message(int dir_fd, const char *name, const ProtobufCMessage *msg, Ttd__V1__SavedFile *file);

/* Reads a whole file of the folder into a new buffer, checking that it is a regular file of
 * this user that nobody else may read or write (expected NULL: any size and checksum).
 * DATA_LOSS for a size or checksum that differs from expected; NOT_FOUND when absent. */
ttd_status_t ttd_state_read_small(int dir_fd, const char *name, const Ttd__V1__SavedFile *expected,
                                  uint8_t **out_data, size_t *out_len);

/* Whether fd is a file of this user that nobody else may read or write; FAILED_PRECONDITION naming name otherwise. */
ttd_status_t ttd_state_check_private(int fd, const char *name);

/* Bytes of a file and the host memory they go to or come from: a tensor's, in the card's
 * memory where the backend shows it to the host. */
typedef struct ttd_state_piece {
  void *mem;
  uint64_t len;
  uint64_t file_offset;
} ttd_state_piece;

/* Writes (pwrite, its writeback started as it goes) or reads (pread) the pieces, split in
 * 64 MiB parts spread over a few threads: a first touch of fresh memory, the page cache's
 * or the card's, costs more than the copy, and costs it per core. The first error wins. */
ttd_status_t ttd_state_pieces_run(int fd, const ttd_state_piece *pieces, size_t n, bool write);

/* Removes the folder name (one level of files) under dir_fd, if it exists. */
void ttd_state_remove_tree(int dir_fd, const char *name);

#endif
