#!/usr/bin/env bash
# scripts/run brings up kvparkd, llama-server and kvpark-proxy on the test model,
# prints the OpenAI base URL, answers a chat completion, a Messages and a Responses
# request through it, and stops all three cleanly on SIGINT (exit 0, every port and the
# socket closed).
#   run_stack_test.sh SOURCE_ROOT BUILD_ROOT     (KVPARK_LLAMA_SERVER in the environment)
set -u
source_root=$1
build_root=$2
[ -x "${KVPARK_LLAMA_SERVER:-}" ] || { echo "skip: needs KVPARK_LLAMA_SERVER"; exit 77; }
command -v curl >/dev/null || { echo "skip: needs curl"; exit 77; }

source "$source_root/tests/proxy/stack_lib.sh"

start_stack --slots 2 --context 4096
[ "$model" = "kvpark-test" ] || fail "model name '$model'"

answer=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "kvpark-test", "max_tokens": 4, "temperature": 0, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]}') ||
  fail "chat completion failed"
echo "$answer" | grep -q '"object":"chat.completion"' || fail "not a chat completion: $answer"
curl -sf "http://127.0.0.1:$port/v1/models" | grep -q '"id":"kvpark-test"' || fail "/v1/models"
# The agent clients' other two formats, through the same front.
answer=$(curl -sf "http://127.0.0.1:$port/v1/messages" -H 'Content-Type: application/json' \
  -d '{"model": "kvpark-test", "max_tokens": 4, "system": "Be brief.", "messages": [{"role": "user", "content": "Hello"}]}') ||
  fail "messages request failed"
echo "$answer" | grep -q '"type":"message"' || fail "not a Messages answer: $answer"
answer=$(curl -sf "http://127.0.0.1:$port/v1/responses" -H 'Content-Type: application/json' \
  -d '{"model": "kvpark-test", "max_output_tokens": 4, "instructions": "Be brief.", "input": "Hello"}') ||
  fail "responses request failed"
echo "$answer" | grep -q '"object":"response"' || fail "not a Responses answer: $answer"
curl -sf "http://127.0.0.1:$port/kvpark/status" | grep -q '"messages":{"requests":1,"answered":1' ||
  fail "/kvpark/status does not count the Messages request"

kill -INT "$run_pid"
wait "$run_pid"
status=$?
run_pid=""
[ $status -eq 0 ] || fail "scripts/run exited $status on SIGINT"
curl -s "http://127.0.0.1:$port/health" >/dev/null && fail "kvpark-proxy still answers"
curl -s "http://127.0.0.1:$llama_port/health" >/dev/null && fail "llama-server still answers"
[ -S "$dir/state/kvparkd.sock" ] && fail "kvparkd's socket is still there"
echo "ok: the stack started, answered and stopped"
