#!/bin/sh
# Builds llama-server from the pinned llama.cpp source (the git bundle inside
# node-llama-cpp's npm package, the same release fetch.sh installs), for the
# kvpark-proxy end-to-end tests and bench. CPU only, statically linked.
#
#   integrations/llama/build-server.sh [CACHE_DIR]
#
# CACHE_DIR defaults to ${KVPARK_LLAMA_CACHE:-$HOME/.cache/kvpark/llama}. A complete
# build there is reused. Prints KVPARK_LLAMA_SERVER=PATH on stdout; progress goes to
# stderr. Needs: npm, git, tar, cmake, ninja, a C++ compiler. Takes a while on two
# cores (the server and its libraries are a few hundred compile steps).
set -eu

version=3.21.1
cache=${1:-${KVPARK_LLAMA_CACHE:-${HOME:-/tmp}/.cache/kvpark/llama}}
prefix=$cache/llama-server-$version

if [ -f "$prefix/.complete" ]; then
  echo "KVPARK_LLAMA_SERVER=$prefix/bin/llama-server"
  exit 0
fi

for tool in npm git tar cmake ninja; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build-server.sh: $tool not found" >&2; exit 1; }
done

mkdir -p "$cache"
work=$(mktemp -d "$cache/.build-server.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

echo "build-server.sh: npm pack node-llama-cpp@$version" >&2
(cd "$work" && npm pack --silent "node-llama-cpp@$version" >/dev/null)
tar xzf "$work/node-llama-cpp-$version.tgz" -C "$work"
git clone --quiet --no-checkout "$work/package/llama/gitRelease.bundle" "$work/llama.cpp"
commit=$(git -C "$work/llama.cpp" rev-parse HEAD)
git -C "$work/llama.cpp" -c advice.detachedHead=false checkout --quiet "$commit"

# No network during the build (no prebuilt web UI download, no HTTPS client), only
# the server target, and ggml tuned for this machine: the binary stays in this cache.
echo "build-server.sh: building llama-server ($commit); this takes several minutes" >&2
cmake -S "$work/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF >&2
ninja -C "$work/build" -j "$(nproc)" llama-server >&2

stage=$work/prefix
mkdir -p "$stage/bin"
cp "$work/build/bin/llama-server" "$stage/bin/"
"$stage/bin/llama-server" --version >&2
printf '%s\n%s\n' "node-llama-cpp $version" "commit $commit" > "$stage/VERSION"
touch "$stage/.complete"

rm -rf "$prefix"
mv "$stage" "$prefix"
echo "build-server.sh: installed $prefix/bin/llama-server" >&2
echo "KVPARK_LLAMA_SERVER=$prefix/bin/llama-server"
