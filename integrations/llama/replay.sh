#!/bin/sh
# Real-engine replay of issue 7's scenarios with llama.cpp: (a) a sibling session
# with a long shared head and no client marker, (c) fan-out of that head across
# engine processes, (f) an engine restart. Every request is a kvpark-llama-engine
# process (prompt: seeded random token ids; a head, then a tail); prints one line
# per request (TTFT = restore + prefill, model load excluded) and a summary.
#
#   replay.sh --model FILE.gguf [--engine PATH] [--kvparkd PATH]
#             [--heads "4096 8192 16384"] [--tail N] [--fanout N]
#
# --engine defaults to $KVPARK_LLAMA_ENGINE, --kvparkd to $KVPARKD. Any GGUF works;
# with the prebuilt libraries of fetch.sh set KVPARK_LLAMA_BACKENDS to their lib dir.
set -eu

model= engine=${KVPARK_LLAMA_ENGINE:-} kvparkd=${KVPARKD:-}
heads="4096 8192 16384" tail=128 fanout=4
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --engine) engine=$2; shift 2 ;;
    --kvparkd) kvparkd=$2; shift 2 ;;
    --heads) heads=$2; shift 2 ;;
    --tail) tail=$2; shift 2 ;;
    --fanout) fanout=$2; shift 2 ;;
    *) echo "replay.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] && [ -x "$engine" ] && [ -x "$kvparkd" ] || {
  echo "replay.sh: needs --model, --engine (kvpark-llama-engine) and --kvparkd" >&2; exit 2; }

work=$(mktemp -d /tmp/kvpark-llama-replay.XXXXXX)
arena=/kvpark-llama-replay-$$
daemon_pid=
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

start_daemon() {  # a fresh kvparkd per scenario: nothing parked
  [ -n "$daemon_pid" ] && kill "$daemon_pid" && wait "$daemon_pid" 2>/dev/null || true
  rm -f "$work/sock"
  "$kvparkd" --socket "$work/sock" --arena-name "$arena" --arena-size 1G --http-listen off \
    --dbus off --disk-dir off >"$work/kvparkd.log" 2>&1 &
  daemon_pid=$!
  i=0
  while [ ! -S "$work/sock" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
}

# request SCENARIO NAME HEAD TOTAL ENGINE-ARGS...: runs one engine, prints its line,
# appends "ttft prefilled" to $work/SCENARIO.NAME. (sh has no locals: r_ names.)
request() {
  r_scenario=$1 r_name=$2 r_head=$3 r_total=$4; shift 4
  out=$("$engine" --model "$model" --socket "$work/sock" --cache-dir "$work/cache" \
        --head "$r_head" --total "$r_total" --ctx $((r_total + 512)) "$@")
  restored=$(echo "$out" | awk '/^restored/ {print $2}')
  kind=$(echo "$out" | awk '/^restored/ {print $3}')
  ttft=$(echo "$out" | awk '/^ttft_ms/ {print $2}')
  : "${restored:=0}" "${kind:=0}"
  case $kind in 1) kind=shared ;; 2) kind=private ;; *) kind=root ;; esac
  prefilled=$((r_total - restored))
  printf '%-3s %-22s head %6d total %6d restored %6d prefilled %6d %-8s ttft %9.1f ms\n' \
    "$r_scenario" "$r_name" "$r_head" "$r_total" "$restored" "$prefilled" "$kind" "$ttft"
  echo "$ttft $prefilled" >>"$work/$r_scenario.$r_name"
}
sum() { awk '{t += $1; p += $2} END {printf "%.1f %d", t, p}' "$work/$1"; }

summary=$work/summary
for h in $heads; do
  start_daemon
  total=$((h + tail))
  request a publisher-A "$h" "$total" --session 1 --tail-seed 1 --plan
  request a sibling-B "$h" "$total" --session 2 --tail-seed 2
  request a sibling-B-no-kvpark "$h" "$total" --tail-seed 2 --no-kvpark
  set -- $(sum a.sibling-B) $(sum a.sibling-B-no-kvpark)
  echo "a head $h: sibling B TTFT $3 ms without kvpark, $1 ms with (x$(awk "BEGIN {printf \"%.1f\", $3 / $1}"))" >>"$summary"
  rm -f "$work"/a.*
done

h=${heads%% *}
total=$((h + tail))
start_daemon
request c publisher "$h" "$total" --session 100 --tail-seed 100 --plan
pids=
for i in $(seq 2 "$fanout"); do
  request c fanout-kvpark "$h" "$total" --session $((100 + i)) --tail-seed $((100 + i)) --plan &
  pids="$pids $!"
done
for p in $pids; do wait "$p"; done
for i in $(seq 1 "$fanout"); do
  request c fanout-no-kvpark "$h" "$total" --tail-seed $((100 + i)) --no-kvpark
done
with=$(( $(sum c.publisher | cut -d' ' -f2) + $(sum c.fanout-kvpark | cut -d' ' -f2) ))
echo "c head $h x $fanout engines: tokens prefilled $(sum c.fanout-no-kvpark | cut -d' ' -f2) without kvpark, $with with" >>"$summary"

start_daemon
request f before-restart "$h" "$total" --session 7 --tail-seed 7 --private --plan
request f after-restart "$h" $((total + 64)) --session 7 --tail-seed 7
request f after-restart-no-kvpark "$h" $((total + 64)) --tail-seed 7 --no-kvpark
echo "f head $h: restarted engine TTFT $(sum f.after-restart-no-kvpark | cut -d' ' -f1) ms without kvpark, $(sum f.after-restart | cut -d' ' -f1) ms with" >>"$summary"

echo
cat "$summary"
