#!/usr/bin/env bash
# bundle.sh — pack the gpu suite and the GPU benchmark, already built with CUDA, into one
# folder that runs on a GPU machine with no compiler, no network and none of the Debian build
# dependencies (run.sh needs all three). The folder holds the stripped binaries, every shared
# library they load except glibc's (libstdc++ apart, used only where the host's is too old),
# and run-bundle.sh, which runs the suite and the benchmark and prints the figures.
#
# Usage: tests/gpu/bundle.sh [BUILD_DIR (default: build)] [OUT_DIR (default: gpu-bundle)]
#        then on the GPU machine: OUT_DIR/run-bundle.sh   (logs also go to $OUT when set)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$repo/build}
dest=${2:-$repo/gpu-bundle}
binaries=(tests/kernels/kernels_gather_scatter_cuda_test tests/device/device_cuda_test
          daemon/kvparkd tests/kvpark-test-engine bench/kernels/kvpark-kernels-bench)

if ! grep -q "^ *CUDA kernels *: *True" "$build/meson-logs/meson-log.txt" 2>/dev/null; then
  echo "bundle.sh: $build was not configured with the CUDA kernels (meson setup -Dcuda=enabled)" >&2
  exit 1
fi
ninja -C "$build" "${binaries[@]}"

rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/std"
for b in "${binaries[@]}"; do strip -o "$dest/bin/$(basename "$b")" "$build/$b"; done
for b in "$dest"/bin/*; do ldd "$b"; done | awk '/=>/ { print $3 }' | sort -u |
  while read -r lib; do
    case $(basename "$lib") in
      libc.so.* | libm.so.*) ;;  # the host's glibc: newer is compatible, older is refused anyway
      libstdc++.so.* | libgcc_s.so.*) cp -L "$lib" "$dest/std/" ;;
      *) cp -L "$lib" "$dest/lib/" ;;
    esac
  done
cp "$repo/tests/gpu/run-bundle.sh" "$dest/"
echo "bundle.sh: $(du -sh "$dest" | cut -f1) in $dest; run $dest/run-bundle.sh on the GPU machine"
