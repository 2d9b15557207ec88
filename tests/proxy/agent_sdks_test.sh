#!/usr/bin/env bash
# The official OpenAI and Anthropic SDKs (npm packages `openai`, `@anthropic-ai/sdk`,
# pinned below) against the one-command stack (scripts/run): Responses and Messages
# siblings over one head, whole and streamed (sdk/agent_sdks.mjs has the checks).
# The packages are installed once into ${KVPARK_NPM_CACHE:-~/.cache/kvpark/npm};
# without node and npm, or when the registry cannot be reached, the test is skipped.
#   agent_sdks_test.sh SOURCE_ROOT BUILD_ROOT     (KVPARK_LLAMA_SERVER in the environment)
set -u
source_root=$1
build_root=$2
openai_version=6.49.0
anthropic_version=1.17.0
[ -x "${KVPARK_LLAMA_SERVER:-}" ] || { echo "skip: needs KVPARK_LLAMA_SERVER"; exit 77; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "skip: needs node, npm"; exit 77; }

sdks=${KVPARK_NPM_CACHE:-${HOME:-/tmp}/.cache/kvpark/npm}/agent-sdks-$openai_version-$anthropic_version
if [ ! -f "$sdks/.complete" ]; then
  mkdir -p "$sdks"
  if ! (cd "$sdks" && timeout 300 npm install --silent --no-audit --no-fund --no-save \
      "openai@$openai_version" "@anthropic-ai/sdk@$anthropic_version" >&2); then
    echo "skip: npm could not install the SDKs (no registry?)"
    exit 77
  fi
  touch "$sdks/.complete"
fi

source "$source_root/tests/proxy/stack_lib.sh"

start_stack --slots 2 --context 8192
# Node resolves packages from the script's folder up: the script runs from the cache.
cp "$source_root/tests/proxy/sdk/agent_sdks.mjs" "$sdks/"
node "$sdks/agent_sdks.mjs" "http://127.0.0.1:$port" "http://127.0.0.1:$llama_port" "$model" ||
  fail "the SDKs' checks failed"
echo "ok: both SDKs were served cached"
