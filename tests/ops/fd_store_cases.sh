# The restart cases both fd-store tests check against a real systemd, sourced by
# fd_store_under_systemd.sh (a user manager) and fd_store_under_pid1.sh (PID 1).
# The sourcing script defines: unit (systemctl VERB on the kvparkd unit), show (one of
# its properties), fail, run_engine (the test engine with its arguments, where the
# daemon's socket is reachable), signal_main (kill -SIGNAL PID where the daemon runs),
# log (kvparkd's log, as this shell reads it), seeds, deadline_sec and manager (how
# the "ok" lines name the manager).

# Polls "$@" until it succeeds or `deadline` seconds pass.
wait_for() {
  local what=$1 deadline=$2
  shift 2
  local until=$((SECONDS + deadline))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= until)); then
      echo "timed out waiting for $what" >&2
      return 1
    fi
    sleep 0.05
  done
}

publish() { for s in "${seeds[@]}"; do run_engine publish --head-seed "$s" >/dev/null; done; }
# Every head restores (each byte checked by the engine): prints the "restored" lines.
restores() { for s in "${seeds[@]}"; do run_engine verify --head-seed "$s" | grep '^restored'; done; }
adoption_lines() { grep -c "from the previous instance" "$log" || true; }
new_main_pid_active() {  # $1: the pid before
  local pid
  pid=$(show MainPID)
  [ "$pid" != 0 ] && [ "$pid" != "$1" ] && [ "$(show ActiveState)" = active ] &&
    [ "$(show SubState)" = running ]
}
expect_adopted_and_restored() {  # $1: what happened, $2: adoption lines expected
  local got
  got=$(restores) || fail "after $1: a verify failed"
  [ "$got" = "$expected" ] || fail "after $1: restores differ: '$got' vs '$expected'"
  [ "$(adoption_lines)" = "$2" ] || fail "after $1: expected adoption line $2, log has $(adoption_lines)"
  grep "from the previous instance" "$log" | tail -1 | grep -q "adopted $entries entries" ||
    fail "after $1: the adoption line does not say $entries entries"
  echo "ok: $1: every head restored from the adopted arena ($manager)"
}

# With the unit started: publishes the heads, then restarts it four ways.
run_restart_cases() {
  publish
  expected=$(restores) || fail "verify before any restart"
  [ "$(echo "$expected" | wc -l)" = "${#seeds[@]}" ] || fail "expected one restore per head: $expected"
  echo "$expected" | grep -q '^restored 0 ' && fail "a head did not restore before the restart: $expected"
  entries=$((${#seeds[@]} * 16))  # 1024-token heads of 64-token blocks
  local pid

  # 1. systemctl restart: SIGTERM, the manager keeps the fds, the new process adopts them.
  pid=$(show MainPID)
  unit restart || fail "restart"
  [ "$(show MainPID)" != "$pid" ] || fail "restart did not start a new process"
  expect_adopted_and_restored "systemctl restart" 1

  # 2. SIGKILL: a crash under Restart=on-failure.
  pid=$(show MainPID)
  signal_main KILL "$pid"
  wait_for "the restart after SIGKILL" "$deadline_sec" new_main_pid_active "$pid" ||
    fail "no restart after SIGKILL"
  expect_adopted_and_restored "kill -9 and Restart=on-failure" 2

  # 3. The watchdog: a stopped daemon misses WATCHDOG=1, the manager aborts it, then
  #    kills it, and restarts it.
  pid=$(show MainPID)
  signal_main STOP "$pid"
  wait_for "the watchdog restart" "$deadline_sec" new_main_pid_active "$pid" ||
    fail "no restart after the watchdog fired"
  expect_adopted_and_restored "a watchdog kill" 3

  # 4. systemctl stop drops the fd store: the next start is fresh and has nothing.
  unit stop || fail "stop"
  unit start || fail "start after stop"
  [ "$(adoption_lines)" = 3 ] || fail "a start after stop adopted something"
  local after_stop line
  after_stop=$(restores) || fail "verify after stop"
  while read -r line; do
    case "$line" in "restored 0 "*) ;; *) fail "after stop and start a head was still served: $line" ;; esac
  done <<<"$after_stop"
  echo "ok: systemctl stop dropped the fd store: a fresh start, nothing served ($manager)"
}
