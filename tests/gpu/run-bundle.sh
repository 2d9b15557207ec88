#!/usr/bin/env bash
# run-bundle.sh — the prepared GPU check from a folder made by bundle.sh: the gpu suite (CUDA
# vs CPU bit-exact; the device API against a real kvparkd) and kvpark-kernels-bench, GPU part
# then CPU part. Each step has a time limit so a hung device cannot eat a short lease. Logs go
# to $OUT (else /tmp/kvpark-gpu). Exit status: 0 all passed, otherwise the first failure's.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/kvpark-gpu}
mkdir -p "$out"
export LD_LIBRARY_PATH=$here/lib
if ldd "$here/bin/kvparkd" | grep -q 'not found'; then
  export LD_LIBRARY_PATH=$here/lib:$here/std  # the host's libstdc++ is older than the build's
fi
if ldd "$here/bin/kvparkd" | grep 'not found'; then
  echo "== FAIL: libraries missing"
  exit 1
fi
export KVPARKD=$here/bin/kvparkd KVPARK_TEST_ENGINE=$here/bin/kvpark-test-engine
echo "== kernel $(uname -r), $(nproc) cpus"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max \
  --format=csv,noheader || true

status=0
step() {  # name, time limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  local start=$SECONDS rc=0
  timeout "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  grep -v -E '^\[ +(RUN|OK) ' "$out/$name.log" | tail -n 60
  echo "== $name: exit $rc after $((SECONDS - start)) s"
  if [[ $rc -ne 0 && $status -eq 0 ]]; then status=$rc; fi
}
step gather_scatter_cuda 150 "$here/bin/kernels_gather_scatter_cuda_test"
step device_cuda 150 "$here/bin/device_cuda_test"
step bench_gpu 120 "$here/bin/kvpark-kernels-bench" --gpu
step bench_cpu 60 "$here/bin/kvpark-kernels-bench" --cpu
echo "== done: exit $status"
exit "$status"
