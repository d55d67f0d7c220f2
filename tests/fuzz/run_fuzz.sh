#!/usr/bin/env bash
# Runs each libFuzzer harness for a while from its seed corpus and sums up the run:
#   tests/fuzz/run_fuzz.sh FUZZ_DIR SECONDS HARNESS...
# FUZZ_DIR holds the binaries (bin/fuzz_NAME, from `make fuzz`); new inputs the fuzzer
# keeps go to FUZZ_DIR/corpus/NAME (tests/fuzz/corpus/ is only read), crashing inputs to
# FUZZ_DIR/artifacts/NAME/, logs to FUZZ_DIR/logs/, the table to FUZZ_DIR/summary.txt.
# libFuzzer stops a harness at its first crash; the exit status is 1 if any crashed.
set -uo pipefail

dir=$1 seconds=$2
shift 2
seeds=$(cd "$(dirname "$0")" && pwd)/corpus
summary=$dir/summary.txt
mkdir -p "$dir/logs"
{
  echo "# make fuzz FUZZ_SECONDS=$seconds ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(clang --version | head -1))"
  printf '%-10s %8s %12s %9s %6s %7s %8s\n' harness seconds execs execs/s cov corpus crashes
} > "$summary"

failed=0
for h in "$@"; do
  mkdir -p "$dir/corpus/$h" "$dir/artifacts/$h"
  rm -f "$dir/artifacts/$h"/*
  log=$dir/logs/$h.log
  echo "fuzz: $h for ${seconds}s"
  "$dir/bin/fuzz_$h" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/$h/" "$dir/corpus/$h" "$seeds/$h" > "$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  time=$(sed -n 's/^stat::.*//; s/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  crashes=$(find "$dir/artifacts/$h" -type f | wc -l)
  [ -n "$time" ] || time=$seconds
  rate=$(( ${execs:-0} / (time > 0 ? time : 1) ))
  printf '%-10s %8s %12s %9s %6s %7s %8s\n' "$h" "$time" "${execs:-?}" "$rate" "${cov:-?}" "${corpus:-?}" "$crashes" >> "$summary"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    echo "fuzz: $h crashed (exit $rc): see $log and $dir/artifacts/$h/"
    grep -m1 -E 'ERROR: |SUMMARY: |fuzz: ' "$log" || true
  fi
done
cat "$summary"
echo "fuzz: summary in $summary"
exit $failed
