#!/usr/bin/env bash
# make demo: starts ttd on a temporary socket, runs the main job against it, stops ttd.
# The main job: tt_demo (devices, tensors moved both ways), then mlp, which trains a
# Fashion-MNIST MLP on the card with the loss on the CPU and prints its test accuracy.
set -euo pipefail
BUILD=${1:-build}
dir=$(mktemp -d /tmp/ttd-demo-XXXXXX)
sock="unix:$dir/ttd.sock"
"$BUILD/bin/ttd" --listen "$sock" --devices 2 2>"$dir/ttd.log" &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 1 500); do [ -S "$dir/ttd.sock" ] && break; sleep 0.01; done
echo "== ttd started (pid $pid) on $sock"
TTD_ADDRESS="$sock" "$BUILD/bin/tt_demo"
echo "== training: mlp"
TTD_ADDRESS="$sock" "$BUILD/bin/mlp" ${MLP_ARGS:-}
rc=$?
kill "$pid"
wait "$pid"
echo "== ttd stopped cleanly; its log:"
sed 's/^/   /' "$dir/ttd.log"
exit $rc
