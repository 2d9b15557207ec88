// Recovery at start: indexes the records the disk tier found, in chain order, and
// removes those no lookup could reach (see docs/disk.md, "Durability invariant").
#include <algorithm>
#include <cassert>
#include <unordered_map>

#include "daemon/disk_mover.h"
#include "daemon/disk_tier.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {

std::vector<const disk::RecordInfo*> DiskMover::reachable_records(const disk::RecoveryReport& report,
                                                             std::vector<const disk::RecordInfo*>& ret_unreachable) {
  // Chain order: a block is reachable when its predecessor's record is (the chain's
  // first block: when its parent is the namespace seed); a snapshot of a block
  // namespace when its anchor block is; snapshot-only namespaces hash their chain
  // from the prompt alone, so their snapshots always are.
  std::vector<const disk::RecordInfo*> order;
  order.reserve(report.records.size());
  for (const disk::RecordInfo& r : report.records) order.push_back(&r);
  std::sort(order.begin(), order.end(), [](const disk::RecordInfo* a, const disk::RecordInfo* b) {
    const bool a_block = a->header.kind == static_cast<uint8_t>(EntryKind::Block);
    const bool b_block = b->header.kind == static_cast<uint8_t>(EntryKind::Block);
    if (a_block != b_block) return a_block;  // blocks first, snapshots after
    return a->header.anchor_chunks < b->header.anchor_chunks;
  });
  struct Key {
    NamespaceId ns;
    Hash128 hash;
    bool operator==(const Key&) const = default;
  };
  struct KeyHasher {
    size_t operator()(const Key& k) const noexcept {
      return Hash128Hasher{}(k.hash) ^ Hash128Hasher{}(k.ns);
    }
  };
  std::unordered_map<Key, uint32_t, KeyHasher> blocks;  // reachable block -> its chain index
  std::vector<const disk::RecordInfo*> reachable;
  for (const disk::RecordInfo* r : order) {
    const disk::RecordHeader& h = r->header;
    bool ok = false;
    if (h.kind == static_cast<uint8_t>(EntryKind::Block)) {
      if (h.anchor_chunks == 0) {
        ok = h.parent_hash == h.namespace_id;
      } else {
        auto it = blocks.find({h.namespace_id, h.parent_hash});
        ok = it != blocks.end() && it->second + 1 == h.anchor_chunks;
      }
      if (ok) blocks.emplace(Key{h.namespace_id, h.key_hash}, h.anchor_chunks);
    } else if (h.block_tokens == 0 || h.anchor_chunks == 0) {
      ok = true;
    } else {
      auto it = blocks.find({h.namespace_id, h.key_hash});
      ok = it != blocks.end() && it->second + 1 == h.anchor_chunks;
    }
    (ok ? reachable : ret_unreachable).push_back(r);
  }
  return reachable;
}

uint64_t DiskMover::recover(const disk::RecoveryReport& report) {
  DiskTier* disk = disk_;
  assert(disk != nullptr);
  uint64_t skipped = 0;
  std::vector<const disk::RecordInfo*> unreachable;
  const std::vector<const disk::RecordInfo*> reachable = reachable_records(report, unreachable);
  for (const disk::RecordInfo* r : unreachable) {
    // No lookup can get to it: the crash came between its write and its predecessor's.
    if (!disk->read_only()) disk->store().remove(r->id);
    ++counters_.unreachable_records_removed;
    ++skipped;
  }
  for (const disk::RecordInfo* reachable_record : reachable) {
    const disk::RecordInfo& record = *reachable_record;
    const disk::RecordHeader& h = record.header;
    const Geometry geometry{.block_tokens = h.block_tokens,
                            .block_payload_bytes = h.block_payload_bytes,
                            .snapshot_required = h.snapshot_required != 0};
    NamespaceIndex ns = 0;
    std::vector<int32_t> tail;
    const bool snapshot = h.kind == static_cast<uint8_t>(EntryKind::Snapshot);
    bool usable =
        table_.register_namespace(h.namespace_id, geometry, 0, ns) == Status::Ok &&
        table_.namespace_info(ns).chain_tokens == h.chain_tokens &&
        (h.kind == static_cast<uint8_t>(EntryKind::Block) || snapshot) &&
        h.image_bytes == shm::extent_bytes_for(h.token_count, h.payload_bytes) &&
        h.entry_class <= entry_class_max && h.evidence <= evidence_max &&
        (!snapshot || disk->read_tail_tokens(record, tail));
    if (usable) {
      const EntrySlot found = snapshot ? table_.find_snapshot(ns, h.key_hash, tail)
                                       : table_.find_block(ns, h.key_hash);
      // An entry adopted on the host: this is its disk copy.
      if (found != no_slot && !table_.entry(found).on_disk &&
          table_.entry(found).payload_checksum == h.payload_checksum) {
        table_.attach_disk_record(found, record.file_bytes);
        continue;
      }
      usable = found == no_slot;
    }
    if (!usable) {
      ++skipped;
      continue;
    }
    NewEntry n{.ns = ns,
               .kind = static_cast<EntryKind>(h.kind),
               .key_hash = h.key_hash,
               .parent_hash = h.parent_hash,
               .tail_tokens = tail,
               .extent_bytes = h.image_bytes,
               .position = h.position,
               .anchor_chunks = h.anchor_chunks,
               .creator_session = h.creator_session,
               .payload_checksum = h.payload_checksum,
               .entry_class = static_cast<EntryClass>(h.entry_class),
               .evidence = static_cast<Evidence>(h.evidence)};
    EntrySlot slot = no_slot;
    (void)table_.insert_on_disk(n, record.file_bytes, slot);
  }
  enforce_disk_capacity();
  return skipped;
}

}  // namespace kvpark::daemon
