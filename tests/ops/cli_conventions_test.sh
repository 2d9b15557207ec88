#!/bin/sh
# Every binary answers --help and --version before doing anything else, and
# refuses an unknown option by name:
#   cli_conventions_test.sh VERSION BINARY...
# Each runs in an empty directory that must stay empty (kvpark-make-test-model
# once wrote a GGUF named --help).
set -u
version=$1
shift
status=0
work=$(mktemp -d /tmp/kvpark-cli-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
out=$work/.out
err=$work/.err

bad() {
  echo "$name: $*" >&2
  status=1
}

# run ARGS...: runs the binary in $work (an empty directory); sets $code.
run() {
  mkdir -p "$work/cwd"
  (cd "$work/cwd" && "$binary" "$@" >"$out" 2>"$err")
  code=$?
  left=$(ls -A "$work/cwd")
  [ -z "$left" ] || bad "'$*' left files behind: $left"
  rm -rf "$work/cwd"
}

for binary in "$@"; do
  name=$(basename "$binary")

  run --help
  [ "$code" = 0 ] || bad "--help exits $code"
  grep -qi '^usage' "$out" || bad "--help prints no usage on stdout: $(head -c 200 "$out")"

  run --version
  [ "$code" = 0 ] || bad "--version exits $code"
  [ "$(cat "$out")" = "$name $version" ] || bad "--version prints '$(cat "$out")', expected '$name $version'"

  run --bogus
  [ "$code" = 2 ] || bad "--bogus exits $code, expected 2"
  grep -q -- "--bogus" "$err" || bad "--bogus is not named on stderr: $(head -c 300 "$err")"
  grep -q "needs a value" "$err" && bad "--bogus: 'needs a value' instead of unknown option"
done

# The help flag wins wherever it stands: nothing is written.
for binary in "$@"; do
  name=$(basename "$binary")
  case $name in
    kvpark-make-test-model)
      run model.gguf --seed 3 --help
      [ "$code" = 0 ] || bad "'model.gguf --help' exits $code"
      run --seed 3
      [ "$code" = 2 ] || bad "'--seed 3' (no output file) exits $code, expected 2"
      ;;
    kvpark-proxy)
      run --bogus value
      grep -q "unknown option --bogus" "$err" || bad "--bogus value: $(cat "$err")"
      ;;
  esac
done
exit $status
