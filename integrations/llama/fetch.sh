#!/bin/sh
# Installs the pinned llama.cpp that tests and CI build against: the headers from
# node-llama-cpp's git bundle of the llama.cpp source and the prebuilt CPU
# libraries of @node-llama-cpp/linux-x64, both from the npm registry.
#
#   integrations/llama/fetch.sh [CACHE_DIR]
#
# CACHE_DIR defaults to ${KVPARK_LLAMA_CACHE:-$HOME/.cache/kvpark/llama}. A complete
# install there is reused. Prints the prefix (for meson -Dllama_prefix=) and its
# include and lib dirs as KEY=VALUE lines on stdout; progress goes to stderr.
# Needs: npm, git, tar, nm.
set -eu

version=3.21.1
cache=${1:-${KVPARK_LLAMA_CACHE:-${HOME:-/tmp}/.cache/kvpark/llama}}
prefix=$cache/node-llama-cpp-$version

report() {
  echo "KVPARK_LLAMA_PREFIX=$prefix"
  echo "KVPARK_LLAMA_INCLUDE=$prefix/include"
  echo "KVPARK_LLAMA_LIB=$prefix/lib"
}

if [ -f "$prefix/.complete" ]; then
  report
  exit 0
fi

for tool in npm git tar nm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "fetch.sh: $tool not found" >&2; exit 1; }
done

mkdir -p "$cache"
work=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

echo "fetch.sh: npm pack node-llama-cpp@$version @node-llama-cpp/linux-x64@$version" >&2
(cd "$work" && npm pack --silent "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >/dev/null)
mkdir "$work/src_pkg" "$work/bin_pkg"
tar xzf "$work/node-llama-cpp-$version.tgz" -C "$work/src_pkg"
tar xzf "$work/node-llama-cpp-linux-x64-$version.tgz" -C "$work/bin_pkg"
src_pkg=$work/src_pkg/package/llama
bins=$work/bin_pkg/package/bins/linux-x64

# The headers must be those the libraries were built from: node-llama-cpp records
# the llama.cpp release of its bundle, the binary package the release it built.
tag_src=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$src_pkg/llama.cpp.info.json")
tag_bin=$(sed -n 's/.*"release": *"\([^"]*\)".*/\1/p' "$bins/_nlcBuildMetadata.json")
if [ -z "$tag_src" ] || [ "$tag_src" != "$tag_bin" ]; then
  echo "fetch.sh: source bundle is '$tag_src' but the libraries were built from '$tag_bin'" >&2
  exit 1
fi

echo "fetch.sh: cloning the llama.cpp bundle ($tag_src)" >&2
git clone --quiet --no-checkout "$src_pkg/gitRelease.bundle" "$work/llama.cpp"
commit=$(git -C "$work/llama.cpp" rev-parse HEAD)
git -C "$work/llama.cpp" checkout --quiet "$commit" -- include ggml/include

stage=$work/prefix
mkdir -p "$stage/include" "$stage/lib/pkgconfig"
cp "$work/llama.cpp/include/"*.h "$work/llama.cpp/ggml/include/"*.h "$stage/include/"
cp "$bins/"*.so "$stage/lib/"
ln -s "libllama.v0.4.0.so" "$stage/lib/libllama.so"
ln -s "libggml.v0.4.0.so" "$stage/lib/libggml.so"

# Every function llama.h declares must be exported by the library.
missing=0
for fn in $(sed -n 's/^ *LLAMA_API[^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' "$stage/include/llama.h" | sort -u); do
  if ! nm -D --defined-only "$stage/lib/libllama.v0.4.0.so" | grep -q " $fn\$"; then
    case $fn in *deprecated*) continue ;; esac
    echo "fetch.sh: llama.h declares $fn, libllama does not export it" >&2
    missing=$((missing + 1))
  fi
done
if [ "$missing" -gt 0 ]; then
  echo "fetch.sh: headers do not match the prebuilt libllama ($missing functions missing)" >&2
  exit 1
fi

cat > "$stage/lib/pkgconfig/llama.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: llama
Description: llama.cpp $tag_src (node-llama-cpp $version prebuilt CPU libraries)
Version: 0.0.0-$tag_src
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lllama -lggml -lggml-base
Cflags: -I\${includedir}
PC
printf '%s\n%s\n%s\n' "node-llama-cpp $version" "llama.cpp $tag_src" "commit $commit" > "$stage/VERSION"
touch "$stage/.complete"

rm -rf "$prefix"
mv "$stage" "$prefix"
echo "fetch.sh: installed llama.cpp $tag_src into $prefix" >&2
report
