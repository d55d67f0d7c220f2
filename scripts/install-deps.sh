#!/usr/bin/env bash
# Installs every Debian package that ttd's build, tests and demo need.
# Idempotent: when everything is present it only checks, and returns in well under a second.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config make gcc
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
  libevent-dev check
  protobuf-compiler python3 python3-grpcio python3-protobuf
  zlib1g-dev libjansson-dev dataset-fashion-mnist
  libsystemd-dev systemd libssl-dev openssl curl groff-base
  libopenmpi-dev openmpi-bin
  python3-torch python3-numpy python3-pytest python3-tqdm
)

# Open MPI: libttparallel, the data-parallel example and the e2e_parallel suite (mpirun).
# PyTorch, numpy and pytest: the Python package's tests (make test-python), and the bench's
# training-step reference.
# --bench: also OpenBLAS, the sgemm reference of `make bench`, which building, testing and
# running ttd do not need.
if [ "${1:-}" = "--bench" ]; then PACKAGES+=(libopenblas-dev); fi
# --fuzz: also what `make fuzz` needs (clang and its libFuzzer runtime); the corpus replay of
# `make test` builds with gcc and needs neither.
if [ "${1:-}" = "--fuzz" ]; then PACKAGES+=(clang libclang-rt-14-dev); fi
# --valgrind: also what `make valgrind` needs.
if [ "${1:-}" = "--valgrind" ]; then PACKAGES+=(valgrind); fi

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
