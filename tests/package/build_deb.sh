#!/bin/sh
# Builds kvpark's Debian packages from a copy of the source tree
# (dpkg-buildpackage -us -uc -b with DEB_BUILD_OPTIONS=nocheck), then:
# lintian on them (any error or warning not overridden fails), their contents and
# maintainer scripts (users, directories, units enabled and started through
# debhelper), the unpacked tree through tests/install/check_tree.py, and the
# unpacked kvparkd and kvparkctl answering --version.
#
#   build_deb.sh SOURCE_ROOT VERSION PYTHON CHECK_TREE
#
# Opt-in (a whole build, several minutes on two cores): skipped (77) unless
# KVPARK_TEST_PACKAGE=1, or when dpkg-buildpackage or lintian is missing.
set -eu
src=$1 version=$2 python=$3 check=$4
[ "${KVPARK_TEST_PACKAGE:-0}" = 1 ] || { echo "KVPARK_TEST_PACKAGE=1 runs this test"; exit 77; }
for tool in dpkg-buildpackage dh lintian; do
  command -v $tool >/dev/null 2>&1 || { echo "$tool not installed"; exit 77; }
done
fail() { echo "FAIL: $*"; status=1; }
status=0

# One place per source tree, so that reruns share ccache's entries (the build's
# paths are part of what ccache hashes) and two worktrees never share a directory.
key=$(printf %s "$src" | cksum | cut -d' ' -f1)
work=${TMPDIR:-/var/tmp}/kvpark-deb-$(id -u)-$key
rm -rf "$work"
mkdir -p "$work/kvpark-$version"
trap 'rm -rf "$work"' EXIT
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  # The working tree as it is (tracked and new files), without build directories.
  (cd "$src" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
    tar --null -T - -cf -) | tar -C "$work/kvpark-$version" -xf -
else
  (cd "$src" && tar --exclude='./build*' --exclude=./debian/tmp -cf - .) |
    tar -C "$work/kvpark-$version" -xf -
fi

if ! (cd "$work/kvpark-$version" && dpkg-checkbuilddeps -P nocheck); then
  echo "build dependencies missing (debian/control, above): apt-get build-dep ./"
  exit 77
fi

upstream=$(sed -n '1s/^kvpark (\([^-)]*\).*/\1/p' "$src/debian/changelog")
[ "$upstream" = "$version" ] || fail "debian/changelog is at $upstream, meson.build at $version"

if command -v ccache >/dev/null 2>&1; then
  CCACHE_DIR=$(ccache --get-config cache_dir) CCACHE_NOHASHDIR=1
  export CCACHE_DIR CCACHE_NOHASHDIR
fi
start=$(date +%s)
if ! (cd "$work/kvpark-$version" &&
      DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" dpkg-buildpackage -us -uc -b \
        >"$work/build.log" 2>&1); then
  tail -n 60 "$work/build.log"
  echo "FAIL: dpkg-buildpackage (log above)"
  exit 1
fi
echo "dpkg-buildpackage: $(( $(date +%s) - start )) s"
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
changes=$(ls "$work"/kvpark_*_"$arch".changes)
deb=$(ls "$work"/kvpark_*_"$arch".deb)
dev=$(ls "$work"/libkvpark-dev_*_"$arch".deb)

# lintian: errors and warnings fail; info and pedantic tags are printed.
if ! lintian --fail-on error,warning --display-info "$changes"; then
  fail "lintian (tags above; overrides go in debian/*.lintian-overrides with a reason)"
fi

# Contents: the files each package must and must not hold.
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$work/kvpark.files"
dpkg-deb -c "$dev" | awk '{print $6}' | sed 's|^\./|/|' >"$work/dev.files"
for f in /usr/sbin/kvparkd /usr/bin/kvparkctl /usr/bin/kvpark-proxy /usr/bin/kvpark-make-test-model \
         /lib/systemd/system/kvparkd.service /lib/systemd/system/kvpark-proxy.service \
         /usr/lib/sysusers.d/kvpark.conf /usr/lib/tmpfiles.d/kvpark.conf \
         /usr/share/dbus-1/system.d/org.kvpark.Park1.conf \
         /usr/share/dbus-1/system-services/org.kvpark.Park1.service \
         /usr/share/man/man8/kvparkd.8.gz /usr/share/doc/kvpark/kvparkd.conf.example; do
  grep -qx "$f" "$work/kvpark.files" || fail "kvpark lacks $f"
done
for f in /usr/include/kvpark/kvpark.h /usr/include/kvpark/kvpark.hpp \
         "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/libkvpark.a" \
         "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/pkgconfig/kvpark.pc" \
         /usr/share/man/man3/libkvpark.3.gz; do
  grep -qx "$f" "$work/dev.files" || fail "libkvpark-dev lacks $f"
done
if grep -E 'bench|replay|llama' "$work/kvpark.files" "$work/dev.files"; then
  fail "benchmarks or the llama.cpp integration are packaged (above)"
fi

# Maintainer scripts, all from debhelper: users and directories at configure, the
# daemon enabled and started, stopped at removal, its state purged with the package.
mkdir "$work/control"
dpkg-deb -e "$deb" "$work/control"
grep -q 'systemd-sysusers.*kvpark.conf' "$work/control/postinst" || fail "postinst does not run systemd-sysusers"
grep -q 'systemd-tmpfiles.*--create kvpark.conf' "$work/control/postinst" || fail "postinst does not run systemd-tmpfiles"
# Users first: tmpfiles.d names them as owners.
[ "$(grep -n -m1 systemd-sysusers "$work/control/postinst" | cut -d: -f1)" -lt \
  "$(grep -n -m1 systemd-tmpfiles "$work/control/postinst" | cut -d: -f1)" ] ||
  fail "postinst runs systemd-tmpfiles before systemd-sysusers"
grep -q "deb-systemd-helper unmask 'kvparkd.service'" "$work/control/postinst" &&
  grep -q "deb-systemd-helper enable 'kvparkd.service'" "$work/control/postinst" ||
  fail "postinst does not enable kvparkd.service"
grep -q "deb-systemd-invoke .*'kvparkd.service'" "$work/control/postinst" ||
  fail "postinst does not start kvparkd.service"
grep -q "deb-systemd-invoke stop .*'kvparkd.service'" "$work/control/prerm" ||
  fail "prerm does not stop kvparkd.service"
grep -q "deb-systemd-helper purge .*'kvparkd.service'" "$work/control/postrm" ||
  fail "postrm does not purge kvparkd.service"

# The unpacked tree passes the install checks; the binaries run.
mkdir "$work/root"
dpkg-deb -x "$deb" "$work/root"
dpkg-deb -x "$dev" "$work/root"
"$python" "$check" "$work/root" /usr "lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)" bin sbin \
  share share/man include || fail "check_tree.py on the unpacked packages"
got=$("$work/root/usr/sbin/kvparkd" --version) || true
[ "$got" = "kvparkd $version" ] || fail "unpacked kvparkd --version: '$got'"
got=$("$work/root/usr/bin/kvparkctl" --version) || true
[ "$got" = "kvparkctl $version" ] || fail "unpacked kvparkctl --version: '$got'"

if [ -n "${KVPARK_PACKAGE_OUT:-}" ]; then
  mkdir -p "$KVPARK_PACKAGE_OUT" && cp "$deb" "$dev" "$changes" "$KVPARK_PACKAGE_OUT/"
fi
[ $status = 0 ] && echo "packages: $(basename "$deb") $(basename "$dev")"
exit $status
