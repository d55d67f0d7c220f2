/* Fuzz harness: the configuration readers (daemon/config.c), the config file's
 * `name = value` lines and the command-line flags, through one option table.
 *
 * Input: u8 mode, then text. Mode bit 0 clear: the text is a config file
 * (ttd_config_apply_text), and also a size and a duration on its own. Set: the text's
 * lines are the flags (ttd_config_load), at most 64; inputs that name --config are
 * skipped, since that option reads a file. Every outcome ends in ttd_config_check and
 * ttd_config_clear, which must free every string an option took. */
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "fuzz_input.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void run_flags(ttd_config *config, char *text) {
  char *argv[MAX_ARGS + 1] = {"ttd"};
  int argc = 1;
  for (char *line = text, *next; line && argc < MAX_ARGS; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    if (strncmp(line, "--config", 8) == 0) return;
    argv[argc++] = line;
  }
  ttd_config_action action;
  ttd_status_free(ttd_config_load(config, argc, argv, &action));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_input in = {data, size};
  uint8_t mode = fuzz_u8(&in);
  char *text = strndup((const char *)in.data, in.left);
  if (!text) abort();
  ttd_config config;
  ttd_config_defaults(&config);
  if (mode & 1) {
    run_flags(&config, text);
  } else {
    ttd_status_free(ttd_config_apply_text(&config, text, "fuzz.conf"));
    uint64_t bytes;
    int64_t ms;
    (void)ttd_config_parse_size(text, &bytes);
    (void)ttd_config_parse_duration_ms(text, &ms);
  }
  ttd_status_free(ttd_config_check(&config));
  ttd_config_clear(&config);
  free(text);
  return 0;
}
