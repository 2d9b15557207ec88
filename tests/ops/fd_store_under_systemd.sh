#!/usr/bin/env bash
# kvparkd under a real systemd: the host tier outlives `systemctl restart`, a SIGKILL
# under Restart= and a watchdog kill, and `systemctl stop` drops it (docs/operations.md,
# "Restarts"). The machine has no systemd as PID 1, so this runs Debian's systemd as a
# user manager (`systemd --user`) in a private mount namespace, where /run/systemd/system
# exists (the one thing systemd checks before it runs as a manager at all) without
# touching the host's /run. Everything the test asserts is systemd's own behaviour:
# its fd store, its Restart=, its watchdog, its notify socket.
#
#   fd_store_under_systemd.sh KVPARKD KVPARK_TEST_ENGINE
#
# Exit 77 (skipped) where a private mount namespace or the user manager is not to be had.
set -euo pipefail

kvparkd=$(realpath "$1")
engine=$(realpath "$2")
systemd_bin=/lib/systemd/systemd
deadline_sec=30  # any one wait below; the whole test takes a few seconds

skip() { echo "SKIP: $*"; exit 77; }

if [ -z "${KVPARK_SYSTEMD_TEST_INSIDE:-}" ]; then
  [ "$(id -u)" = 0 ] || skip "needs root for a private mount namespace"
  [ -x "$systemd_bin" ] || skip "no $systemd_bin"
  command -v unshare >/dev/null || skip "no unshare"
  unshare -m --propagation private true 2>/dev/null || skip "no private mount namespace here"
  exec env KVPARK_SYSTEMD_TEST_INSIDE=1 unshare -m --propagation private "$0" "$@"
fi

# Inside the namespace: a /run of our own, marked as booted with systemd.
mount -t tmpfs -o mode=0755 tmpfs /run || skip "cannot mount a private /run"
mkdir -p /run/systemd/system
work=$(mktemp -d /tmp/kvpark-systemd.XXXXXX)
manager_pid=""
cleanup() {
  if [ -n "$manager_pid" ]; then
    XDG_RUNTIME_DIR=$work/xdg systemctl --user stop kvparkd-test.service >/dev/null 2>&1 || true
    kill "$manager_pid" 2>/dev/null || true
    wait "$manager_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -m 0700 "$work/xdg"
mkdir -p "$work/config/systemd/user"
export XDG_RUNTIME_DIR=$work/xdg XDG_CONFIG_HOME=$work/config
socket=$work/kvparkd.sock
log=$work/kvparkd.log
arena=/kvpark-systemd-test-$$

# The shipped unit's restart keys (systemd/kvparkd.service.in), without its user and
# sandbox (a user manager cannot switch users or set up most namespaces).
cat >"$work/config/systemd/user/kvparkd-test.service" <<EOF
[Service]
Type=notify
NotifyAccess=main
ExecStart=$kvparkd --socket $socket --arena-name $arena --arena-size 67108864 --http-listen off --dbus off --disk-dir off --state-dir off
Restart=on-failure
RestartSec=100ms
FileDescriptorStoreMax=8
WatchdogSec=2s
TimeoutAbortSec=2s
LimitCORE=0
StandardOutput=append:$log
StandardError=append:$log
EOF

"$systemd_bin" --user --log-target=console --log-level=warning >"$work/manager.log" 2>&1 &
manager_pid=$!

# Polls "$@" until it succeeds or the deadline passes.
wait_for() {
  local what=$1
  shift
  local until=$((SECONDS + deadline_sec))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= until)); then
      echo "FAIL: timed out waiting for $what" >&2
      return 1
    fi
    sleep 0.05
  done
}
manager_running() {
  local state
  state=$(systemctl --user is-system-running 2>/dev/null) || true
  [ "$state" = running ] || [ "$state" = degraded ]
}
wait_for "the user manager" manager_running
unit() { systemctl --user "$@" kvparkd-test.service; }
show() { systemctl --user show -p "$1" --value kvparkd-test.service; }
fail() {
  echo "FAIL: $*" >&2
  echo "--- kvparkd log" >&2
  cat "$log" >&2 || true
  echo "--- manager log" >&2
  cat "$work/manager.log" >&2 || true
  exit 1
}

seeds=(901 902 903)
publish() { for s in "${seeds[@]}"; do "$engine" --socket "$socket" publish --head-seed "$s" >/dev/null; done; }
# Every head restores (each byte checked by the engine): prints the "restored" lines.
restores() {
  for s in "${seeds[@]}"; do "$engine" --socket "$socket" verify --head-seed "$s" | grep '^restored'; done
}
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
  echo "ok: $1: every head restored from the adopted arena"
}

unit start || fail "start"  # Type=notify: returns once kvparkd sent READY=1
publish
expected=$(restores) || fail "verify before any restart"
[ "$(echo "$expected" | wc -l)" = "${#seeds[@]}" ] || fail "expected one restore per head: $expected"
echo "$expected" | grep -q '^restored 0 ' && fail "a head did not restore before the restart: $expected"
entries=$((${#seeds[@]} * 16))  # 1024-token heads of 64-token blocks

# 1. systemctl restart: SIGTERM, the manager keeps the fds, the new process adopts them.
pid=$(show MainPID)
unit restart || fail "restart"
[ "$(show MainPID)" != "$pid" ] || fail "restart did not start a new process"
expect_adopted_and_restored "systemctl restart" 1

# 2. SIGKILL: a crash under Restart=on-failure.
pid=$(show MainPID)
kill -KILL "$pid"
wait_for "the restart after SIGKILL" new_main_pid_active "$pid" || fail "no restart after SIGKILL"
expect_adopted_and_restored "kill -9 and Restart=on-failure" 2

# 3. The watchdog: a stopped daemon misses WATCHDOG=1, the manager aborts it, then
#    kills it, and restarts it.
pid=$(show MainPID)
kill -STOP "$pid"
wait_for "the watchdog restart" new_main_pid_active "$pid" || fail "no restart after the watchdog fired"
expect_adopted_and_restored "a watchdog kill" 3

# 4. systemctl stop drops the fd store: the next start is fresh and has nothing.
unit stop || fail "stop"
unit start || fail "start after stop"
[ "$(adoption_lines)" = 3 ] || fail "a start after stop adopted something"
after_stop=$(restores) || fail "verify after stop"
while read -r line; do
  case "$line" in "restored 0 "*) ;; *) fail "after stop and start a head was still served: $line" ;; esac
done <<<"$after_stop"
echo "ok: systemctl stop dropped the fd store: a fresh start, nothing served"
