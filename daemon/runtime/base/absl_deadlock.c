/* The switch is C++ (absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle)); it is
 * found by its exported name in the Abseil that libgrpc loaded, with Debian's inline
 * namespace, and called with the enum's first value, kIgnore. */
#define _GNU_SOURCE
#include "base/absl_deadlock.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define SET_MODE_SYMBOL "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE"
#define ON_DEADLOCK_CYCLE_IGNORE 0

int ttd_absl_deadlock_detection_off(void) {
  const char *keep = getenv("TTD_ABSL_DEADLOCK_DETECTION");
  if (keep && strcmp(keep, "1") == 0) return 0;
  void (*set_mode)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, SET_MODE_SYMBOL);
  if (!set_mode) return 0;
  set_mode(ON_DEADLOCK_CYCLE_IGNORE);
  return 1;
}
