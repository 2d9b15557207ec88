#!/bin/sh
# Every binary reports the release meson was configured with (proto/version.h):
#   version_test.sh VERSION BINARY...
set -eu
version=$1
shift
status=0
for binary in "$@"; do
  name=$(basename "$binary")
  got=$("$binary" --version)
  if [ "$got" != "$name $version" ]; then
    echo "$binary --version: '$got', expected '$name $version'" >&2
    status=1
  fi
done
exit $status
