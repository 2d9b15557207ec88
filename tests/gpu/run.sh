#!/usr/bin/env bash
# run.sh — the prepared GPU check: on a machine with an NVIDIA GPU, build the kernels with CUDA,
# run the 'gpu' test suite (CUDA vs CPU, bit-exact) and the GPU benchmark (restore bandwidth
# into a paged cache as a ratio to cudaMemcpy H2D from pinned memory), and print the figures.
#
# Self-contained: installs the build dependencies with apt-get when they are missing, builds
# only the targets it needs in $KVPARK_GPU_BUILD (default: build-gpu in the repository root).
# Exit status: 0 all passed; 77 skipped (no nvcc, or no usable CUDA device); otherwise failed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${KVPARK_GPU_BUILD:-$repo/build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)
mapfile -t apt_packages < <(sed -e 's/#.*//' "$repo/scripts/debian-packages" | tr ' ' '\n' | grep -v '^$')

say() { printf '== %s\n' "$*"; }

missing_deps() {
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || return 1
  done
}

if ! missing_deps; then
  say "installing build dependencies: ${apt_packages[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null; then
  for dir in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [[ -x $dir/nvcc ]] && export PATH=$dir:$PATH && break
  done
fi
if ! command -v nvcc >/dev/null; then
  say "SKIP: nvcc not found; the CUDA kernels cannot be built here"
  exit 77
fi
say "nvcc: $(nvcc --version | tail -n 1)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max \
    --format=csv,noheader || true
fi

cd "$repo"
if [[ -f $build/build.ninja ]]; then
  meson setup --reconfigure "$build" -Dcuda=enabled -Dbuildtype=release -Db_ndebug=false >/dev/null
else
  meson setup "$build" -Dcuda=enabled -Dbuildtype=release -Db_ndebug=false >/dev/null
fi

targets=(tests/kernels/kernels_gather_scatter_cuda_test tests/device/device_cuda_test daemon/kvparkd
         tests/kvpark-test-engine)
bench=bench/kernels/kvpark-kernels-bench
if ninja -C "$build" -t targets all | grep -q "^$bench:"; then
  targets+=("$bench")
else
  say "note: $bench is not in the build (bench/meson.build lacks subdir('kernels'))"
fi
say "building: ${targets[*]}"
ninja -C "$build" -j "$jobs" "${targets[@]}"

say "gpu suite"
log=$(mktemp)
status=0
meson test -C "$build" --suite gpu --no-rebuild --print-errorlogs -v 2>&1 | tee "$log" || status=$?
if grep -q 'no CUDA device' "$log"; then
  say "SKIP: $(grep -m1 -o 'no CUDA device.*' "$log")"
  rm -f "$log"
  exit 77
fi
rm -f "$log"
if [[ $status -ne 0 ]]; then
  say "FAIL: gpu suite"
  exit "$status"
fi
grep -h -E '^\[  (PASSED|FAILED|SKIPPED) ' "$build/meson-logs/testlog.txt" 2>/dev/null || true

if [[ -x $build/$bench ]]; then
  say "benchmark (GPU part, then CPU part)"
  "$build/$bench" --gpu
  "$build/$bench" --cpu
fi
say "done"
