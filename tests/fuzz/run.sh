#!/bin/sh
# Builds the frame-decoder fuzzer with clang-14 (libFuzzer + ASan + UBSan) and runs
# it for a bounded time over a generated seed corpus.
# Usage: run.sh SOURCE_ROOT [extra libFuzzer args]. Exit 77 (skip) when clang++-14
# or its fuzzer runtime (libclang-rt-14-dev) is missing.
set -eu
root=${1:?usage: run.sh SOURCE_ROOT}
shift
cxx=$(command -v clang++-14 || true)
if [ -z "$cxx" ]; then
  echo "SKIP: clang++-14 not found (apt-get install clang-14)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/kvpark-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT
flags="-std=c++20 -O1 -g -I$root -fno-omit-frame-pointer"
probe="$work/probe.cpp"
printf '%s\n' '#include <cstdint>' '#include <cstddef>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' > "$probe"
if ! "$cxx" -fsanitize=fuzzer "$probe" -o "$work/probe" 2>/dev/null; then
  echo "SKIP: clang-14 fuzzer runtime missing (apt-get install libclang-rt-14-dev)"
  exit 77
fi
sources="$root/tests/fuzz/fuzz_frame.cpp $root/proto/wire.cpp"
# shellcheck disable=SC2086
"$cxx" $flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  $sources -o "$work/fuzz_frame"
# shellcheck disable=SC2086
"$cxx" $flags -DKVPARK_FUZZ_SEED_WRITER $sources -o "$work/seed_writer"
mkdir -p "$work/corpus"
"$work/seed_writer" "$work/corpus"
echo "fuzz_frame: $(ls "$work/corpus" | wc -l) seeds"
cd "$work"
exec "$work/fuzz_frame" -max_total_time="${KVPARK_FUZZ_SECONDS:-20}" -max_len=4096 \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$@" "$work/corpus"
