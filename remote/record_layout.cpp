// Keys, manifests and images of the remote tier (see record_layout.h).
#include "remote/record_layout.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "proto/names.h"
#include "proto/xxh3.h"
#include "remote/remote_limits.h"

namespace kvpark::remote {
namespace {

std::string key_base(const EntryKey& key) {
  std::string k = "kvpark:r" + std::to_string(record_format_version) + ":" + hex128(key.ns) +
                  ":{" + hex128(key.key_hash) + "}:";
  if (key.snapshot) {
    k += "s" + std::to_string(key.position) + "." + hex128(key.tail_digest);
  } else {
    k += "b";
  }
  return k;
}

}  // namespace

std::string manifest_key(const EntryKey& key) { return key_base(key); }

std::string chunk_key(const EntryKey& key, uint32_t index) {
  return key_base(key) + ":" + std::to_string(index);
}

std::string snapshot_index_key(const EntryKey& key) {
  return "kvpark:r" + std::to_string(record_format_version) + ":" + hex128(key.ns) + ":{" +
         hex128(key.key_hash) + "}:s";
}

std::string index_field(const EntryKey& key) {
  assert(key.snapshot && "only snapshots are indexed");
  std::string f(index_field_bytes, '\0');
  std::memcpy(f.data(), &key.position, 4);
  std::memcpy(f.data() + 4, &key.tail_digest.low, 8);
  std::memcpy(f.data() + 12, &key.tail_digest.high, 8);
  return f;
}

bool decode_index_field(std::string_view field, EntryKey& ret_key) {
  if (field.size() != index_field_bytes) return false;
  uint32_t position = 0;
  Hash128 digest;
  std::memcpy(&position, field.data(), 4);
  std::memcpy(&digest.low, field.data() + 4, 8);
  std::memcpy(&digest.high, field.data() + 12, 8);
  if (position == 0) return false;
  ret_key.snapshot = true;
  ret_key.position = position;
  ret_key.tail_digest = digest;
  return true;
}

std::string index_value(std::span<const int32_t> tail_tokens) {
  return std::string(reinterpret_cast<const char*>(tail_tokens.data()), tail_tokens.size_bytes());
}

bool decode_index_value(std::string_view value, const EntryKey& key,
                        std::vector<int32_t>& ret_tail_tokens) {
  if (value.size() % sizeof(int32_t) != 0 || value.size() / sizeof(int32_t) > index_tail_tokens_max) {
    return false;
  }
  std::vector<int32_t> tail(value.size() / sizeof(int32_t));
  if (!value.empty()) std::memcpy(tail.data(), value.data(), value.size());
  if (tail_digest_of(tail) != key.tail_digest || tail.size() > key.position) return false;
  ret_tail_tokens = std::move(tail);
  return true;
}

uint32_t chunk_count_for(uint64_t image_bytes, uint32_t chunk_bytes) {
  return static_cast<uint32_t>((image_bytes + chunk_bytes - 1) / chunk_bytes);
}

ManifestHeader manifest_header_for(const EntryKey& key) {
  ManifestHeader h{};
  h.magic = manifest_magic;
  h.format_version = record_format_version;
  h.kind = static_cast<uint8_t>(key.snapshot ? EntryKind::Snapshot : EntryKind::Block);
  h.namespace_id = key.ns;
  h.key_hash = key.key_hash;
  h.position = key.position;
  h.tail_digest = key.tail_digest;
  return h;
}

std::string encode_manifest(const Manifest& manifest) {
  const ManifestHeader& h = manifest.header;
  assert(h.chunk_count == manifest.chunk_checksums.size() && "a checksum per chunk");
  std::string value(sizeof h + 8 * manifest.chunk_checksums.size() + 8, '\0');
  std::memcpy(value.data(), &h, sizeof h);
  std::memcpy(value.data() + sizeof h, manifest.chunk_checksums.data(),
              8 * manifest.chunk_checksums.size());
  const uint64_t sum = XXH3_64bits(value.data(), value.size() - 8);
  std::memcpy(value.data() + value.size() - 8, &sum, 8);
  return value;
}

Status decode_manifest(std::string_view value, Manifest& ret_manifest) {
  if (value.size() < sizeof(ManifestHeader) + 8 || value.size() > manifest_bytes_max) {
    return Status::Corrupt;
  }
  uint64_t sum = 0;
  std::memcpy(&sum, value.data() + value.size() - 8, 8);
  if (XXH3_64bits(value.data(), value.size() - 8) != sum) return Status::Corrupt;
  Manifest m;
  std::memcpy(&m.header, value.data(), sizeof m.header);
  const ManifestHeader& h = m.header;
  if (h.magic != manifest_magic || h.format_version != record_format_version) return Status::Corrupt;
  if (h.kind != static_cast<uint8_t>(EntryKind::Block) &&
      h.kind != static_cast<uint8_t>(EntryKind::Snapshot)) {
    return Status::Corrupt;
  }
  if (h.chunk_bytes < chunk_bytes_min || h.chunk_bytes > chunk_bytes_max ||
      h.chunk_count > chunks_per_entry_max ||
      h.chunk_count != chunk_count_for(m.image_bytes(), h.chunk_bytes) ||
      value.size() != sizeof h + 8 * uint64_t{h.chunk_count} + 8) {
    return Status::Corrupt;
  }
  m.chunk_checksums.resize(h.chunk_count);
  std::memcpy(m.chunk_checksums.data(), value.data() + sizeof h, 8 * uint64_t{h.chunk_count});
  ret_manifest = std::move(m);
  return Status::Ok;
}

bool manifest_names(const Manifest& manifest, const EntryKey& key) {
  const ManifestHeader& h = manifest.header;
  const bool snapshot = h.kind == static_cast<uint8_t>(EntryKind::Snapshot);
  return h.namespace_id == key.ns && h.key_hash == key.key_hash && snapshot == key.snapshot &&
         (!snapshot || (h.position == key.position && h.tail_digest == key.tail_digest));
}

Hash128 block_chain_hash(const Hash128& parent, std::span<const int32_t> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, &parent.low, 8);
  XXH3_128bits_update(&state, &parent.high, 8);
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t x = XXH3_128bits_digest(&state);
  return Hash128{x.low64, x.high64};
}

Hash128 tail_digest_of(std::span<const int32_t> tail_tokens) {
  if (tail_tokens.empty()) return {};
  const XXH128_hash_t h = XXH3_128bits(tail_tokens.data(), tail_tokens.size_bytes());
  return {h.low64, h.high64};
}

}  // namespace kvpark::remote
