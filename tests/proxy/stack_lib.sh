# Sourced by the tests that drive the one-command stack (run_stack_test.sh,
# agent_sdks_test.sh), after they set source_root and build_root: a work folder
# (dir, out: scripts/run's output) removed at exit with the stack stopped, fail(), and
# start_stack, which runs scripts/run in the background on free ports and waits for
# its ready line (sets port, llama_port, run_pid, model).

dir=$(mktemp -d /tmp/kvpark-stack-test-XXXXXX)
out=$dir/run.out

# Ports below the kernel's ephemeral range, so no outgoing connection of a test running
# beside this one holds them; another test's listener still might, so a start that
# finds its port taken is tried again on another.
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
port_tries=5

stop_stack() {
  [ -n "${run_pid:-}" ] && kill -TERM "$run_pid" 2>/dev/null && wait "$run_pid" 2>/dev/null
  run_pid=""
}
cleanup() {
  stop_stack
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "--- run output"; cat "$out"
  for log in "$dir"/state/*.log; do echo "--- $log"; tail -20 "$log"; done
  exit 1
}

# start_stack SCRIPTS_RUN_ARGS...
start_stack() {
  local deadline=$((SECONDS + 240)) try
  for try in $(seq "$port_tries"); do
    port=$((20000 + RANDOM % (ephemeral_low - 20002)))
    llama_port=$((port + 1))
    # Job control on: a background job of a script without it starts with SIGINT
    # ignored, which it then cannot trap; Ctrl-C at a terminal reaches it like this.
    set -m
    KVPARK_RUN_DIR=$dir/state KVPARK_BUILD_DIR=$build_root \
      "$source_root/scripts/run" --no-setup --port "$port" --llama-port "$llama_port" \
      --daemon-http off "$@" >"$out" 2>&1 &
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
}
