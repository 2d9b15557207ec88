#!/usr/bin/env bash
# scripts/run brings up kvparkd, llama-server and kvpark-proxy on the test model,
# prints the OpenAI base URL, answers a chat completion through it, and stops all
# three cleanly on SIGINT (exit 0, every port and the socket closed).
#   run_stack_test.sh SOURCE_ROOT BUILD_ROOT     (KVPARK_LLAMA_SERVER in the environment)
set -u
source_root=$1
build_root=$2
[ -x "${KVPARK_LLAMA_SERVER:-}" ] || { echo "skip: needs KVPARK_LLAMA_SERVER"; exit 77; }
command -v curl >/dev/null || { echo "skip: needs curl"; exit 77; }

dir=$(mktemp -d /tmp/kvpark-run-test-XXXXXX)
out=$dir/run.out
# Ports below the kernel's ephemeral range, so no outgoing connection of a test running
# beside this one holds them; another test's listener still might, so a start that
# finds its port taken is tried again on another.
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
port_tries=5
cleanup() {
  [ -n "${run_pid:-}" ] && kill -TERM "$run_pid" 2>/dev/null && wait "$run_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- run output"; cat "$out"
  for log in "$dir"/state/*.log; do echo "--- $log"; tail -20 "$log"; done
  exit 1
}

deadline=$((SECONDS + 240))
for try in $(seq "$port_tries"); do
  port=$((20000 + RANDOM % (ephemeral_low - 20002)))
  llama_port=$((port + 1))
  # Job control on: a background job of a script without it starts with SIGINT
  # ignored, which it then cannot trap; Ctrl-C at a terminal reaches it like this.
  set -m
  KVPARK_RUN_DIR=$dir/state KVPARK_BUILD_DIR=$build_root \
    "$source_root/scripts/run" --no-setup --port "$port" --llama-port "$llama_port" --slots 2 \
    --context 4096 --daemon-http off >"$out" 2>&1 &
  run_pid=$!
  set +m
  until grep -q "OpenAI base URL: http://127.0.0.1:$port/v1" "$out"; do
    if ! kill -0 "$run_pid" 2>/dev/null; then
      wait "$run_pid"
      run_pid=""
      break
    fi
    [ $SECONDS -lt $deadline ] || fail "not ready in time"
    sleep 0.2
  done
  [ -n "$run_pid" ] && break
  cat "$dir"/state/*.log "$out" 2>/dev/null | grep -q "Address already in use" ||
    fail "scripts/run exited before it was ready"
  echo "port $port or $llama_port is taken (try $try of $port_tries); trying others"
done
[ -n "$run_pid" ] || fail "every port tried was taken"
model=$(sed -n 's/.*(model "\(.*\)").*/\1/p' "$out")
[ "$model" = "kvpark-test" ] || fail "model name '$model'"

answer=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "kvpark-test", "max_tokens": 4, "temperature": 0, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]}') ||
  fail "chat completion failed"
echo "$answer" | grep -q '"object":"chat.completion"' || fail "not a chat completion: $answer"
curl -sf "http://127.0.0.1:$port/v1/models" | grep -q '"id":"kvpark-test"' || fail "/v1/models"

kill -INT "$run_pid"
wait "$run_pid"
status=$?
run_pid=""
[ $status -eq 0 ] || fail "scripts/run exited $status on SIGINT"
curl -s "http://127.0.0.1:$port/health" >/dev/null && fail "kvpark-proxy still answers"
curl -s "http://127.0.0.1:$llama_port/health" >/dev/null && fail "llama-server still answers"
[ -S "$dir/state/kvparkd.sock" ] && fail "kvparkd's socket is still there"
echo "ok: the stack started, answered and stopped"
