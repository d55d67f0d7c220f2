/* Replays fuzz inputs without libFuzzer, for `make test` (built with gcc, linked with a
 * harness): every file named, and every file in every folder named (in name order), goes
 * once through LLVMFuzzerTestOneInput. A crash, a sanitizer report or a harness's abort
 * (an accounting leak) fails the run; so does finding no input at all. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path, size_t size) {
  FILE *f = fopen(path, "rb");
  uint8_t *input = malloc(size ? size : 1); /* exact size: reading past the input is an ASan error */
  int ok = f && input && fread(input, 1, size, f) == size;
  if (f) fclose(f);
  if (ok) LLVMFuzzerTestOneInput(input, size);
  else fprintf(stderr, "replay: cannot read %s\n", path);
  free(input);
  return ok ? 0 : -1;
}

static int replay_dir(const char *dir, int *count) {
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort);
  if (n < 0) {
    fprintf(stderr, "replay: cannot read folder %s\n", dir);
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < n; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
    if (rc == 0 && names[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      rc = replay_file(path, (size_t)st.st_size);
      (*count)++;
    }
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  int count = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      return 1;
    }
    int rc = S_ISDIR(st.st_mode) ? replay_dir(argv[i], &count) : (count++, replay_file(argv[i], (size_t)st.st_size));
    if (rc != 0) return 1;
  }
  if (count == 0) {
    fprintf(stderr, "replay: no input found\n");
    return 1;
  }
  printf("%s: %d inputs replayed, no crash, no accounting leak\n", argv[0], count);
  return 0;
}
