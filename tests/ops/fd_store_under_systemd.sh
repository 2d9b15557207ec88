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

source "$(dirname "$0")/fd_store_cases.sh"
manager_running() {
  local state
  state=$(systemctl --user is-system-running 2>/dev/null) || true
  [ "$state" = running ] || [ "$state" = degraded ]
}
wait_for "the user manager" "$deadline_sec" manager_running
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
manager="a user manager"
run_engine() { "$engine" --socket "$socket" "$@"; }
signal_main() { kill "-$1" "$2"; }

unit start || fail "start"  # Type=notify: returns once kvparkd sent READY=1
run_restart_cases
