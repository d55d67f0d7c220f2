#!/usr/bin/env bash
# make demo: starts ttd on a temporary socket and a free admin port, runs the main job
# against it, shows a few of its metrics, and stops it. The main job: tt_demo (devices,
# tensors moved both ways), then mlp, which trains a Fashion-MNIST MLP on the card with the
# loss on the CPU and prints its test accuracy, then the same flow in PyTorch
# (client/python/examples/mlp.py: x.to("tt"), ttd.compile, loss.backward() into the card).
# MLP_ARGS go to the C mlp; PY_MLP_ARGS (default --epochs 1) to the PyTorch one.
# When anything fails, ttd's log is printed.
# DEMO_ADMIN=off runs ttd without its admin listener.
set -uo pipefail
BUILD=${1:-build}
dir=$(mktemp -d /tmp/ttd-demo-XXXXXX)
sock="unix:$dir/ttd.sock"
log="$dir/ttd.log"
pid=
done_ok=0

cleanup() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  fi
  if [ "$done_ok" != 1 ]; then
    echo "== make demo failed; ttd's log ($log):" >&2
    sed 's/^/   /' "$log" >&2 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "== $*" >&2
  exit 1
}

# A port the kernel calls free now (it stays free unless something takes it meanwhile).
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

admin=${DEMO_ADMIN:-}
if [ -z "$admin" ]; then admin="127.0.0.1:$(free_port)" || fail "no free TCP port for the admin listener"; fi

"$BUILD/bin/ttd" --listen "$sock" --devices 2 --admin "$admin" 2>"$log" &
pid=$!
for _ in $(seq 1 500); do
  grep -q 'event=ready' "$log" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { wait "$pid"; pid=; fail "ttd exited while starting"; }
  sleep 0.01
done
grep -q 'event=ready' "$log" || fail "ttd did not become ready in 5 s"
echo "== ttd started (pid $pid) on $sock, admin ${admin}"

TTD_ADDRESS="$sock" "$BUILD/bin/tt_demo" || fail "tt_demo failed"
echo "== training: mlp"
TTD_ADDRESS="$sock" "$BUILD/bin/mlp" ${MLP_ARGS:-} || fail "mlp failed"
lib="$(realpath "$BUILD/lib/libttclient.so")"
# ldd's output read whole first: grep -q stops at the first match, and under pipefail an ldd
# still writing would then die of SIGPIPE and fail the test.
if [[ "$(ldd "$lib")" == *libasan* ]]; then
  # python3 cannot load a libttclient built with AddressSanitizer (make SAN=1).
  echo "== training in PyTorch: skipped, $lib is built with sanitizers"
else
  echo "== training in PyTorch: client/python/examples/mlp.py"
  TTD_ADDRESS="$sock" TTD_LIB="$lib" \
    /usr/bin/python3 "$(dirname "$0")/../client/python/examples/mlp.py" ${PY_MLP_ARGS:---epochs 1} || fail "the PyTorch mlp example failed"
fi

if [ "$admin" != off ]; then
  host=${admin%:*}
  port=${admin##*:}
  if exec 3<>"/dev/tcp/$host/$port"; then
    printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' "$host" >&3
    echo "== a few of ttd's metrics (http://$admin/metrics):"
    grep -E '^ttd_(rpc_total\{method="(Execute|OpenSession)"|bytes_to_(device|host)_total|device_memory_used_bytes)' <&3 |
      sed 's/^/   /'
    exec 3<&-
  fi
fi

kill "$pid"
wait "$pid"
rc=$?
pid=
[ "$rc" = 0 ] || fail "ttd exited with status $rc on SIGTERM"
done_ok=1
echo "== ttd stopped cleanly; its log:"
sed 's/^/   /' "$log"
