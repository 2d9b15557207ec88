// Value types every part agrees on: 128-bit hashes, namespace geometry and the
// enumerations every door names (proto/names.h spells them).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace kvpark {

// XXH3-128 value; also the namespace fingerprint (DESIGN.md §2).
struct Hash128 {
  uint64_t low = 0;
  uint64_t high = 0;
  auto operator<=>(const Hash128&) const = default;
};

struct Hash128Hasher {
  size_t operator()(const Hash128& h) const noexcept { return h.low ^ (h.high * 0x9e3779b97f4a7c15ull); }
};

using NamespaceId = Hash128;

// What a namespace declares at HELLO. Two engines sharing a namespace id must agree on it.
struct Geometry {
  uint32_t block_tokens = 0;         // 0 = snapshot-only engine
  uint64_t block_payload_bytes = 0;  // bytes per block image, all layers
  bool snapshot_required = false;    // recurrent/hybrid: restore needs a snapshot
  bool operator==(const Geometry&) const = default;
};

enum class EntryKind : uint8_t { Block = 1, Snapshot = 2 };

// Where an entry's payload is: the host arena, the disk tier, or both.
enum class Tier : uint8_t { Host = 1, Disk = 2, Both = 3 };

// Who says this state is worth keeping (DESIGN.md §2).
enum class Evidence : uint8_t {
  DefaultAutomatic = 0,
  RequestedAutomatic = 1,
  ExplicitBreakpoint = 2,
  EngineStructural = 3,
  ObservedRecurrence = 4,
};
inline constexpr uint8_t evidence_max = 4;

enum class EntryClass : uint8_t { Private = 0, Shared = 1 };
inline constexpr uint8_t entry_class_max = 1;

// How a lookup's restored prefix came to be parked (reported per lookup and in stats).
enum class ReuseKind : uint8_t {
  Root = 0,                // nothing restorable: prefill from the root
  SharedStablePrefix = 1,  // a prefix parked as shared or by another session
  PrivateTurnClosure = 2,  // this session's own earlier turn
};
inline constexpr uint8_t reuse_kind_max = 2;

}  // namespace kvpark
