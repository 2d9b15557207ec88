#!/bin/sh
# systemd-analyze verify on a generated unit (kvparkd.service, kvpark-proxy.service),
# with ExecStart= pointing at the built binary and the man pages on MANPATH
# (Documentation= is checked), then systemd-analyze security --offline with the 2.5
# exposure threshold.
# Usage: systemd_verify.sh UNIT BINARY MANPAGE...   Exit 77 when it cannot run here.
set -u
unit=$1 binary=$2
name=$(basename "$unit")
shift 2
command -v systemd-analyze >/dev/null 2>&1 || { echo "systemd-analyze not installed"; exit 77; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
for page in "$@"; do
  section=${page##*.}
  mkdir -p "$tmp/man/man$section"
  cp "$page" "$tmp/man/man$section/"
done
sed "s|^ExecStart=.*|ExecStart=$binary|" "$unit" > "$tmp/$name"
if ! out=$(MANPATH="$tmp/man" systemd-analyze verify "$tmp/$name" 2>&1); then
  case $out in
    *"Failed to initialize manager"*|*"Operation not permitted"*|*"No such file or directory"*"/run/systemd"*)
      echo "systemd-analyze verify cannot run here: $out"; exit 77 ;;
  esac
  echo "$out"
  exit 1
fi
[ -n "$out" ] && { echo "verify printed warnings:"; echo "$out"; exit 1; }
if systemd-analyze security --help 2>&1 | grep -q -- --offline; then
  report=$(systemd-analyze security --offline=true --threshold=25 "$tmp/$name" 2>&1)
  status=$?
  echo "$report" | tail -n 1
  [ $status -eq 0 ] || { echo "$report"; exit 1; }
fi
exit 0
