// The weights digest: XXH3-128 of a model file, cached by (device, inode, size,
// mtime) so an unchanged file is read once. No llama.cpp needed: kvpark-proxy uses
// it for the model file a llama-server reports.
#pragma once

#include <string>

#include "client/kvpark.h"

namespace kvpark::llama {

enum class DigestStatus { ok, not_found, io_error };

// $KVPARK_LLAMA_CACHE, else $HOME/.cache/kvpark/llama.
std::string default_cache_dir();

// XXH3-128 of the file at model_path. With a cache_dir, the digest is kept there.
DigestStatus digest_model_file(const std::string& model_path, const std::string& cache_dir,
                               kvpark_hash128* ret_digest);

}  // namespace kvpark::llama
