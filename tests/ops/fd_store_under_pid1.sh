#!/usr/bin/env bash
# kvparkd under systemd running as PID 1: the host tier outlives `systemctl restart`, a
# SIGKILL under Restart= and a watchdog kill, and `systemctl stop` drops it
# (docs/operations.md, "Restarts"). The machine's own PID 1 is no systemd, so this boots
# Debian's systemd in a container (systemd-nspawn --volatile=yes: a tmpfs root over the
# host's /usr) and runs kvparkd there as a system service with the shipped unit's restart
# keys, user and sandbox. Everything the test asserts is that manager's own behaviour: its fd store, its
# Restart=, its watchdog, its notify socket.
#
#   fd_store_under_pid1.sh KVPARKD KVPARK_TEST_ENGINE KVPARKD_SERVICE KVPARK_SYSUSERS
#
# Exit 77 (skipped) without root or systemd-nspawn, or where no container boots.
set -euo pipefail

kvparkd=$(realpath "$1")
engine=$(realpath "$2")
unit_file=$(realpath "$3")  # the built kvparkd.service
sysusers=$(realpath "$4")   # systemd/kvpark.sysusers
boot_deadline_sec=180  # the container's boot, on a loaded machine
deadline_sec=60        # any other wait below; the whole test takes a few seconds

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to start a container"
command -v systemd-nspawn >/dev/null || skip "no systemd-nspawn (Debian's systemd-container)"
command -v nsenter >/dev/null || skip "no nsenter"

work=$(mktemp -d /tmp/kvpark-pid1.XXXXXX)
machine=kvpark-pid1-$$
nspawn_pid=""
cleanup() {
  if [ -n "$nspawn_pid" ]; then
    kill "$nspawn_pid" 2>/dev/null || true
    wait "$nspawn_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
inner=/srv/kvpark-pid1-test
socket=/run/kvpark/kvparkd.sock  # the unit's RuntimeDirectory
log=$work/kvparkd.log
arena=/kvpark-pid1-test-$$

source "$(dirname "$0")/fd_store_cases.sh"

# The binaries and the work directory under $inner inside, never under /tmp (the unit's
# PrivateTmp= would hide them); the rest of the root is the container's own tmpfs.
systemd-nspawn -D / --volatile=yes --register=no --keep-unit --machine="$machine" \
  --bind-ro="$(dirname "$kvparkd")":$inner/daemon --bind-ro="$(dirname "$engine")":$inner/engine \
  --bind-ro="$(dirname "$unit_file")":$inner/unit --bind-ro="$(dirname "$sysusers")":$inner/sysusers \
  --bind="$work":$inner/work \
  -b --console=pipe >"$work/container.log" 2>&1 </dev/null &
nspawn_pid=$!

# The container's PID 1, as the host sees it: the systemd whose parent is nspawn.
leader=""
find_leader() {
  local pid
  for pid in $(pgrep -P "$nspawn_pid" 2>/dev/null); do
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = systemd ]; then
      leader=$pid
      return 0
    fi
  done
  return 1
}
inside() { nsenter -t "$leader" -m -u -i -n -p -C -- "$@"; }
booted() {
  local state
  state=$(inside systemctl is-system-running 2>/dev/null) || true
  [ "$state" = running ] || [ "$state" = degraded ]
}
if ! wait_for "the container's systemd" "$boot_deadline_sec" find_leader ||
  ! wait_for "the container's boot" "$boot_deadline_sec" booted; then
  kill -0 "$nspawn_pid" 2>/dev/null || skip "no container boots here: $(tail -3 "$work/container.log")"
  echo "FAIL: the container did not finish booting" >&2
  cat "$work/container.log" >&2
  exit 1
fi
[ "$(inside cat /proc/1/comm)" = systemd ] || { echo "FAIL: PID 1 inside is not systemd" >&2; exit 1; }

# The shipped unit as built (systemd/kvparkd.service.in): its user, sandbox and restart
# keys as they are. A drop-in points it at this build, makes the watchdog quick, and keeps
# the disk tier and the HTTP and D-Bus surfaces off; the users come from the shipped
# sysusers file.
inside systemd-sysusers "$inner/sysusers/$(basename "$sysusers")"
inside cp "$inner/unit/$(basename "$unit_file")" /etc/systemd/system/kvparkd.service
inside mkdir -p /etc/systemd/system/kvparkd.service.d
inside tee /etc/systemd/system/kvparkd.service.d/test.conf >/dev/null <<EOF
[Service]
ExecStart=
ExecStart=$inner/daemon/$(basename "$kvparkd") --kept-memory-dir /run/kvparkd-kept --socket $socket --arena-name $arena --arena-size 67108864 --http-listen off --dbus off --disk-dir off --state-dir off
WatchdogSec=2s
TimeoutAbortSec=2s
LimitCORE=0
StandardOutput=append:$inner/work/kvparkd.log
StandardError=append:$inner/work/kvparkd.log
EOF
inside systemctl daemon-reload

unit() { inside systemctl "$@" kvparkd.service; }
show() { inside systemctl show -p "$1" --value kvparkd.service; }
fail() {
  echo "FAIL: $*" >&2
  echo "--- kvparkd log" >&2
  cat "$log" >&2 || true
  echo "--- the unit's journal" >&2
  inside journalctl -u kvparkd.service --no-pager >&2 || true
  exit 1
}

seeds=(911 912 913)
manager="systemd as PID 1"
run_engine() { inside "$inner/engine/$(basename "$engine")" --socket "$socket" "$@"; }
signal_main() { inside kill "-$1" "$2"; }

unit start || fail "start"  # Type=notify: returns once kvparkd sent READY=1
[ "$(inside stat -c %U "/proc/$(show MainPID)")" = kvpark ] || fail "kvparkd does not run as kvpark"
# The state segment and the index memory are files of the unit's own tmpfs
# (TemporaryFileSystem=, kept_memory_dir), not memfds; the restarts below adopt them.
kept_files=$(inside find "/proc/$(show MainPID)/fd" -lname '/run/kvparkd-kept/*' | wc -l)
[ "$kept_files" -ge 2 ] || fail "the state segment and index memory are not in /run/kvparkd-kept: $(inside ls -l "/proc/$(show MainPID)/fd")"
grep -q "kept_memory_dir" "$log" && fail "kvparkd refused the unit's kept_memory_dir"
# Its mount as the daemon sees it: huge pages, and no size limit of its own (a page past
# one would fault SIGBUS; tmpfs lists size=0k for none).
kept_mount=$(inside grep " /run/kvparkd-kept " "/proc/$(show MainPID)/mountinfo") ||
  fail "no /run/kvparkd-kept mount in the daemon's namespace"
case "$kept_mount" in *huge=within_size*) ;; *) fail "the unit's tmpfs is not huge=within_size: $kept_mount" ;; esac
case "$kept_mount" in *,size=[1-9]*) fail "the unit's tmpfs has a size limit: $kept_mount" ;; esac
echo "ok: the state segment and index memory are files of the unit's tmpfs ($manager)"
grep "on transparent huge pages" "$log" || echo "(the kernel gave that tmpfs no huge page here)"
run_restart_cases
