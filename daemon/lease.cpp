// How a lease is described and when it is settled (see lease.h).
#include "daemon/lease.h"

#include <algorithm>

namespace kvpark::daemon {

ReuseKind reuse_kind_of(const Entry& e, uint64_t session_id) {
  return e.entry_class == EntryClass::Shared || e.creator_session != session_id
             ? ReuseKind::SharedStablePrefix
             : ReuseKind::PrivateTurnClosure;
}

bool lease_settled(const EntryTable& table, const Lease& lease) {
  auto settled = [&](EntrySlot slot) {
    const Entry& e = table.entry(slot);
    return e.dead || !e.promoting;
  };
  auto written = [&](const std::pair<EntrySlot, uint64_t>& inflight) {
    const EntrySlot slot = table.slot_for_id(inflight.second);
    return slot == no_slot || table.entry(slot).sealed;  // sealed, or aborted and gone
  };
  return !lease.remote_pending && std::all_of(lease.blocks.begin(), lease.blocks.end(), settled) &&
         std::all_of(lease.snapshots.begin(), lease.snapshots.end(), settled) &&
         std::all_of(lease.inflight.begin(), lease.inflight.end(), written);
}

void describe_lease(const EntryTable& table, uint64_t lease_id, const Lease& lease,
                    wire::LookupReply& ret) {
  const NamespaceInfo& info = table.namespace_info(lease.ns);
  ret = wire::LookupReply{};
  ret.lease_id = lease_id;
  ret.capture_hint_tokens = lease.capture_hint_tokens;
  ret.inflight_tokens = lease_settled(table, lease) ? 0 : lease.inflight_tokens;
  size_t blocks = 0;
  while (blocks < lease.blocks.size() && !table.entry(lease.blocks[blocks]).dead) ++blocks;
  ret.restorable_tokens = info.geometry.snapshot_required
                              ? 0
                              : static_cast<uint32_t>(blocks * info.geometry.block_tokens);
  ret.reuse_kind = static_cast<uint8_t>(
      ret.restorable_tokens > 0
          ? reuse_kind_of(table.entry(lease.blocks[blocks - 1]), lease.session_id)
          : ReuseKind::Root);
  for (size_t i = 0; i < blocks; ++i) {
    const Entry& e = table.entry(lease.blocks[i]);
    ret.block_offsets.push_back(e.extent_offset);
    ret.block_checksums.push_back(e.payload_checksum);
    if (ret.host_blocks == i && table.host_readable(e)) ++ret.host_blocks;
  }
  for (EntrySlot slot : lease.snapshots) {
    const Entry& e = table.entry(slot);
    if (e.dead) continue;
    ret.snapshots.push_back({.extent_offset = e.extent_offset,
                             .position = e.position,
                             .anchor_chunks = e.anchor_chunks,
                             .reuse_kind = static_cast<uint32_t>(reuse_kind_of(e, lease.session_id)),
                             .ready = table.host_readable(e) ? 1u : 0u,
                             .payload_checksum = e.payload_checksum});
  }
}

}  // namespace kvpark::daemon
