#!/bin/sh
# meson install into a fresh temporary directory, then check_tree.py on it.
#   install_tree.sh BUILDDIR PYTHON CHECK_TREE PREFIX LIBDIR BINDIR SBINDIR DATADIR MANDIR INCLUDEDIR
set -eu
build=$1 python=$2 check=$3
shift 3
dest=$(mktemp -d "${TMPDIR:-/tmp}/kvpark-install-XXXXXX")
trap 'rm -rf "$dest"' EXIT
meson install -C "$build" --destdir "$dest" --no-rebuild --quiet
"$python" "$check" "$dest" "$@"
