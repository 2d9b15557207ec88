#!/bin/sh
# Lints every man page with mandoc; exit 77 (skipped) when mandoc is missing.
command -v mandoc >/dev/null 2>&1 || { echo "mandoc not installed"; exit 77; }
status=0
for page in "$@"; do
  mandoc -Tlint -Wwarning "$page" || status=1
done
exit $status
