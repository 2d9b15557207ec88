// How an entry is laid out in a Redis-protocol store (docs/remote.md, "Layout").
//
// An entry is identified by its key: namespace + chain hash for a block;
// namespace + anchor hash + position + tail-token digest for a snapshot. Its
// *image* is the entry's token ids (int32, little-endian) followed by its payload:
// the bytes every host agrees on (the arena's entry header is rebuilt by the
// reader), so two hosts writing the same entry write identical values. The image is
// cut into chunks of at most chunk_bytes_max, one key each; the manifest, written
// after every chunk, names the entry, its sizes and one XXH3-64 per chunk, and ends
// with an XXH3-64 of itself. A reader that finds no manifest sees nothing; one that
// finds a manifest finds every chunk it lists (unless the store evicted one: then a
// chunk is missing or fails its checksum, and the entry is a miss).
//
// Keys: "kvpark:r<format>:<namespace hex>:{<hash hex>}:<b|s<position>.<tail hex>>"
// for the manifest, and the same with ":<chunk index>" for chunks. The hash tag is
// the entry's chain (or anchor) hash: one entry's keys share a slot (one node
// serves its restore), and a chain's blocks spread over the cluster. The format
// version is in the keys as well as in the manifest, so readers of different
// versions never meet each other's values.
//
// Snapshots are also listed in their anchor's *index*, a Redis hash at
// "kvpark:r<format>:<namespace hex>:{<anchor hex>}:s" (same hash tag: it lives
// with the snapshots it names): one field per snapshot, its position (u32) then its
// tail digest (20 bytes), whose value is its tail token ids (int32). A writer sets
// the field after the manifest, so a field names a snapshot that was whole; a
// reader learns from the index which snapshots an anchor has, and their tails,
// before fetching any of them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "proto/status.h"
#include "proto/types.h"

namespace kvpark::remote {

// Bump when the key scheme, the manifest or the image layout changes.
inline constexpr uint16_t record_format_version = 1;
inline constexpr uint32_t manifest_magic = 0x4d52564bu;  // "KVRM" little-endian

struct EntryKey {
  NamespaceId ns;
  Hash128 key_hash;  // block: its chain hash; snapshot: its anchor hash
  bool snapshot = false;
  uint32_t position = 0;  // snapshot: its exact token position
  Hash128 tail_digest;    // snapshot: XXH3-128 of its tail token ids
  bool operator==(const EntryKey&) const = default;
};

std::string manifest_key(const EntryKey& key);
std::string chunk_key(const EntryKey& key, uint32_t index);

// The index of the snapshots at key.key_hash (an anchor) in key.ns; and the field
// naming the snapshot `key` in it.
std::string snapshot_index_key(const EntryKey& key);
inline constexpr size_t index_field_bytes = 4 + 16;  // position, tail digest
std::string index_field(const EntryKey& key);
// Fills position and tail_digest of ret_key (ns and key_hash untouched); false when
// `field` is not one index_field() writes.
bool decode_index_field(std::string_view field, EntryKey& ret_key);
// A field's value: the tail token ids; false when `value` is not a whole number of
// them, more than index_tail_tokens_max, or not the tokens ret_key's digest names.
std::string index_value(std::span<const int32_t> tail_tokens);
bool decode_index_value(std::string_view value, const EntryKey& key,
                        std::vector<int32_t>& ret_tail_tokens);

// The manifest's fixed part. Layout is the format: trivially copyable, fixed size.
struct ManifestHeader {
  uint32_t magic;
  uint16_t format_version;
  uint8_t kind;         // EntryKind
  uint8_t entry_class;  // EntryClass
  uint8_t evidence;     // Evidence
  uint8_t snapshot_required;
  uint16_t reserved0;
  uint32_t block_tokens;
  uint32_t chain_tokens;
  uint32_t token_count;  // token ids at the start of the image
  uint32_t position;
  uint32_t anchor_chunks;
  uint32_t chunk_bytes;
  uint32_t chunk_count;
  uint32_t reserved1;
  uint64_t block_payload_bytes;
  uint64_t payload_bytes;
  uint64_t payload_checksum;  // XXH3-64 of the payload, as sealed
  Hash128 namespace_id;
  Hash128 key_hash;
  Hash128 parent_hash;  // blocks: the predecessor's chain hash
  Hash128 tail_digest;  // snapshots
};
static_assert(std::is_trivially_copyable_v<ManifestHeader>);
static_assert(sizeof(ManifestHeader) == 136, "the manifest layout is the record format");

struct Manifest {
  ManifestHeader header{};
  std::vector<uint64_t> chunk_checksums;  // XXH3-64 of each chunk
  uint64_t image_bytes() const {
    return uint64_t{header.token_count} * sizeof(int32_t) + header.payload_bytes;
  }
};

// Chunks an image of this size takes; 0 for an empty image.
uint32_t chunk_count_for(uint64_t image_bytes, uint32_t chunk_bytes);

// A manifest header for `key` with magic, version and key fields filled in; the
// caller sets sizes, class, evidence and geometry.
ManifestHeader manifest_header_for(const EntryKey& key);

std::string encode_manifest(const Manifest& manifest);
// Ok, or Corrupt when the value is not a whole, self-consistent manifest of this
// format: wrong magic or version, bad checksum, chunk size or count past the limits,
// sizes that disagree.
Status decode_manifest(std::string_view value, Manifest& ret_manifest);
// Whether a decoded manifest describes the entry `key` names (not a foreign value).
bool manifest_names(const Manifest& manifest, const EntryKey& key);

// A memcpy that may fail (the daemon's guarded arena access: a page a client took
// away is a failed copy, not SIGBUS).
using CopyFunction = bool (*)(void* dst, const void* src, size_t count);

// An entry's image as two runs of bytes, where they are in the caller's memory.
// With `copy` set, every byte is read through it (into the writer's own buffer) and
// never touched otherwise; a failed copy fails the write (Corrupt, nothing written).
struct ImageView {
  const uint8_t* tokens = nullptr;  // token_count * 4 bytes
  uint64_t tokens_bytes = 0;
  const uint8_t* payload = nullptr;
  uint64_t payload_bytes = 0;
  CopyFunction copy = nullptr;
};
// Where a read puts the image; with `copy` set, every byte is written through it and
// the target is never read.
struct ImageTarget {
  uint8_t* tokens = nullptr;
  uint64_t tokens_bytes = 0;
  uint8_t* payload = nullptr;
  uint64_t payload_bytes = 0;
  CopyFunction copy = nullptr;
};

// Calls f(run pointer, bytes) for the runs of [offset, offset + bytes) of the image.
template <typename Byte, typename F>
void for_image_range(Byte* tokens, uint64_t tokens_bytes, Byte* payload, uint64_t offset,
                     uint64_t bytes, F&& f) {
  if (offset < tokens_bytes) {
    const uint64_t n = std::min(bytes, tokens_bytes - offset);
    f(tokens + offset, n);
    offset += n;
    bytes -= n;
  }
  if (bytes > 0) f(payload + (offset - tokens_bytes), bytes);
}

// XXH3-128 chain hash of one block: h = XXH3-128(parent || tokens) (DESIGN.md §2).
Hash128 block_chain_hash(const Hash128& parent, std::span<const int32_t> tokens);
// XXH3-128 of a snapshot's tail token ids (zero for an empty tail), as keys use it.
Hash128 tail_digest_of(std::span<const int32_t> tail_tokens);

}  // namespace kvpark::remote
