#include "wire/address.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define SYSTEM_ADDRESS "unix:/run/ttd/ttd.sock"

int ttd_default_address(char *buf, size_t len) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;
  if (geteuid() == 0) {
    n = snprintf(buf, len, SYSTEM_ADDRESS);
  } else if (xdg && xdg[0] == '/') {
    n = snprintf(buf, len, "unix:%s/ttd.sock", xdg);
  } else {
    n = snprintf(buf, len, "unix:/tmp/ttd-%u/ttd.sock", (unsigned)geteuid());
  }
  return n < 0 || (size_t)n >= len ? -1 : 0;
}

int ttd_default_client_addresses(char out[][TTD_ADDRESS_MAX], int max) {
  int n = 0;
  if (n < max && ttd_default_address(out[n], TTD_ADDRESS_MAX) == 0) n++;
  if (n < max && (n == 0 || strcmp(out[0], SYSTEM_ADDRESS) != 0)) snprintf(out[n++], TTD_ADDRESS_MAX, SYSTEM_ADDRESS);
  return n;
}

/* A candidate's folder that another user could have made, or could put a socket in (a
 * /tmp/ttd-UID made first by someone else, listening to catch the token the client sends):
 * not a folder of this user's or root's, or writable by others. The system address's folder
 * is the service's, under root's /run. */
#define UNTRUSTED_FOLDER (-1000)

static bool folder_trusted(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return true;
  char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  if (n >= sizeof(dir)) return false;
  memcpy(dir, path, n);
  dir[n] = '\0';
  struct stat st;
  if (lstat(dir, &st) != 0) return true; /* nothing there: the connect says so */
  return S_ISDIR(st.st_mode) && (st.st_uid == geteuid() || st.st_uid == 0) && !(st.st_mode & (S_IWGRP | S_IWOTH));
}

/* 0 when a Unix socket accepts a connection at address, else the errno of the attempt (or
 * UNTRUSTED_FOLDER, not tried). */
static int probe(const char *address) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  const char *path = address + 5;
  if (strlen(path) >= sizeof(sa.sun_path)) return ENAMETOOLONG;
  if (strcmp(address, SYSTEM_ADDRESS) != 0 && !folder_trusted(path)) return UNTRUSTED_FOLDER;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int err = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 ? 0 : errno;
  close(fd);
  return err;
}

static const char *probe_text(int err) {
  switch (err) {
    case ENOENT: return "no such socket";
    case EACCES:
    case EPERM: return "permission denied: add your user to the socket's group (ttd for the service)";
    case ECONNREFUSED: return "refused: a stale socket, its ttd is gone";
    case UNTRUSTED_FOLDER: return "not tried: its folder is another user's, or others may write to it";
    default: return strerror(err);
  }
}

int ttd_find_default_daemon(char *out, size_t len, char *why, size_t why_len) {
  char candidates[TTD_ADDRESS_CANDIDATES][TTD_ADDRESS_MAX];
  int n = ttd_default_client_addresses(candidates, TTD_ADDRESS_CANDIDATES);
  return ttd_find_daemon_among((const char(*)[TTD_ADDRESS_MAX])candidates, n, out, len, why, why_len);
}

int ttd_find_daemon_among(const char candidates[][TTD_ADDRESS_MAX], int n, char *out, size_t len, char *why,
                          size_t why_len) {
  size_t used = 0;
  if (why_len) why[0] = '\0';
  for (int i = 0; i < n; i++) {
    int err = probe(candidates[i]);
    if (err == 0) {
      if (snprintf(out, len, "%s", candidates[i]) >= (int)len) return -1;
      return 0;
    }
    if (used < why_len) {
      int w = snprintf(why + used, why_len - used, "%s%s (%s)", i ? ", " : "", candidates[i], probe_text(err));
      if (w > 0) used += (size_t)w;
    }
  }
  if (used < why_len) {
    snprintf(why + used, why_len - used,
             "; start one (`ttd &` for your own, or `sudo systemctl start ttd` for the service), or set "
             "TTD_ADDRESS to where one listens");
  }
  return -1;
}
