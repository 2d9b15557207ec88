#!/bin/sh
# Runs the hostile-client corruption test against libkvpark with payload
# verification switched off (tests/fault/checksums_off.cpp). Passes only when that
# test fails because altered bytes reached the victim: proof that it detects a
# missing verification rather than passing regardless.
#   $1: the test binary linked against the unverified library
set -u
out=$("$1" --gtest_filter='HostileClient.AlteredSealedPayloadsRestoreAsMissesAndAreCounted' 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  printf '%s\n' "$out"
  echo "mutation check: the corruption test passed with verification off" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -q 'was handed over with wrong bytes'; then
  printf '%s\n' "$out"
  echo "mutation check: the corruption test failed, but not on wrong bytes (exit $rc)" >&2
  exit 1
fi
echo "mutation check: with verification off the corruption test fails on wrong bytes, as it must"
