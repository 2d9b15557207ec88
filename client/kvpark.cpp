// The libkvpark C ABI over Channel (see kvpark.h for the contract).
//
// Everything read from the arena is checked before it is trusted: extents must lie
// inside the mapping, entry headers must name what we asked for, and a block's
// stored token ids must equal the prompt's exactly (a hash only narrows).
#include "client/kvpark.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <vector>

#include "client/c_boundary.h"
#include "client/chain_hash.h"
#include "client/channel.h"
#include "client/device_access.h"
#include "client/payload_checksum.h"
#include "proto/limits.h"
#include "proto/paths.h"
#include "shm/arena_format.h"

using kvpark::Hash128;
using kvpark::Status;
namespace limits = kvpark::limits;
namespace shm = kvpark::shm;
namespace wire = kvpark::wire;
using kvpark::client::Attachment;
using kvpark::client::status_of_current_exception;

static_assert(KVPARK_PROTOCOL_VERSION == limits::protocol_version);
static_assert(sizeof(kvpark_stats) == sizeof(wire::StatsReply));
static_assert(sizeof(kvpark_hash128) == sizeof(Hash128));

struct kvpark_client {
  kvpark_client(std::string path, wire::HelloRequest hello, int reply_timeout_msec)
      : channel(std::move(path), hello, reply_timeout_msec),
        namespace_id(hello.namespace_id),
        geometry(hello.geometry),
        prefill_tokens_per_second(hello.prefill_tokens_per_second) {}
  kvpark::client::Channel channel;
  kvpark::NamespaceId namespace_id;
  kvpark::Geometry geometry;
  uint32_t prefill_tokens_per_second = 0;
  uint32_t chain_tokens = 0;
};

struct kvpark_plan {
  kvpark_client* client = nullptr;
  Attachment attachment;  // keeps the arena mapped while the plan lives
  uint64_t lease_id = 0;
  uint32_t restorable_tokens = 0;
  kvpark_reuse_kind reuse_kind = KVPARK_REUSE_ROOT;
  kvpark_reuse_kind block_reuse_kind = KVPARK_REUSE_ROOT;  // of the block prefix alone
  std::vector<const uint8_t*> blocks;  // payloads
  std::vector<uint64_t> block_extents;    // data-region offsets, for REPORT_CORRUPT
  std::vector<uint64_t> block_checksums;  // as sealed, from the daemon
  std::vector<uint8_t> block_verified;    // 1: checked in place by kvpark_plan_block()
  const uint8_t* snapshot = nullptr;
  uint64_t snapshot_bytes = 0;
  uint32_t snapshot_position = 0;
  uint64_t snapshot_extent = 0;
  uint64_t snapshot_checksum = 0;
  bool snapshot_verified = false;
  // Parts copied so far by kvpark_plan_read_snapshot(), hashed as they were copied.
  std::unique_ptr<kvpark::client::StreamingChecksum> snapshot_read;
  // Per block, the parts copied so far by kvpark_plan_read_block() (empty until one is).
  std::vector<std::unique_ptr<kvpark::client::StreamingChecksum>> block_reads;
  uint32_t pending_tokens = 0;      // restorable once promotions land (>= restorable)
  uint32_t inflight_tokens = 0;     // past that, what another engine is prefilling now
  uint32_t capture_hint_tokens = 0;
  uint64_t session_id = 0;
  std::vector<int32_t> tokens;      // kept only while promotions are pending
  std::vector<Hash128> hashes;
  std::vector<uint8_t> release_frame;  // its capacity taken up front: release never allocates
  uint32_t restored_tokens = 0;        // reported at release (kvpark_plan_set_restored_tokens)
  bool counted_open = false;           // by the channel (Channel::call opens_grant)
};

struct kvpark_reservation {
  kvpark_client* client = nullptr;
  Attachment attachment;
  uint64_t reservation_id = 0;
  std::vector<uint8_t*> blocks;  // payloads; nullptr = not ours to write
  std::vector<uint64_t> block_checksums;  // from kvpark_reservation_write_block()
  std::vector<uint8_t> block_checksummed;  // 1: block_checksums[i] is current
  uint64_t block_bytes = 0;
  uint8_t* snapshot = nullptr;
  uint64_t snapshot_bytes = 0;
  // Written in order from offset 0 through kvpark_reservation_write_snapshot().
  std::unique_ptr<kvpark::client::StreamingChecksum> snapshot_stream;
  bool snapshot_out_of_order = false;
  std::vector<uint8_t> finish_frame;  // its capacity taken up front: seal never allocates
  std::vector<uint64_t> finish_checksums;  // capacity taken up front, one per reserved payload
  bool counted_open = false;  // by the channel (Channel::call opens_grant) until finished
};

// One RELEASE, SEAL or ABORT frame: a header and an id.
constexpr size_t id_frame_bytes = wire::frame_header_bytes + sizeof(uint64_t);
// RELEASE: the lease id and the tokens restored.
constexpr size_t release_frame_bytes = id_frame_bytes + sizeof(uint32_t);

namespace {

// A wait looks the prompt up again each time what it waited for settles; the lease
// that gives may wait on one more step (a remote tail after the blocks), not on an
// endless chain.
constexpr int lookups_per_wait_max = 3;

kvpark_status to_c(Status s) { return static_cast<kvpark_status>(s); }

// Runs `copy` over [p, p+bytes) of the arena with its page tables filled first
// (shm::ArenaMapping::prefault: one call per 2 MiB instead of a fault per page).
template <typename Copy>
auto copy_prefaulted(const Attachment& a, const void* p, uint64_t bytes, Copy copy) {
  a.mapping->prefault(p, bytes);
  return copy();
}

// Ends the connection when an exception (an allocation failure) unwinds past it
// before dismiss(): the reply granted a lease or reservation nothing would end
// otherwise (the daemon ends them at EOF; the next call reconnects).
class GrantGuard {
 public:
  explicit GrantGuard(kvpark_client* client)
      : client_(client), exceptions_(std::uncaught_exceptions()) {}
  ~GrantGuard() {
    if (client_ != nullptr && std::uncaught_exceptions() > exceptions_) client_->channel.drop();
  }
  GrantGuard(const GrantGuard&) = delete;
  GrantGuard& operator=(const GrantGuard&) = delete;
  void dismiss() { client_ = nullptr; }  // the grant is recorded where it will be ended

 private:
  kvpark_client* client_;
  int exceptions_;
};

// Runs one request; `status` is the daemon's answer when transport succeeded.
Status call(kvpark_client* client, std::vector<uint8_t>& request, uint64_t generation,
            std::vector<uint8_t>& ret_body, Attachment& ret_attachment, bool opens_grant = false) {
  Status answer = Status::Ok;
  Status s =
      client->channel.call(request, generation, answer, ret_body, ret_attachment, opens_grant);
  return s != Status::Ok ? s : answer;
}

std::vector<Hash128> hash_chunks(const kvpark_client* client, const int32_t* tokens,
                                 size_t chunks) {
  std::vector<Hash128> hashes(chunks);
  kvpark::client::chain_hashes(client->namespace_id,
                               {tokens, chunks * client->chain_tokens}, client->chain_tokens,
                               hashes);
  return hashes;
}

const shm::EntryHeader* entry_at(const Attachment& a, uint64_t offset, uint64_t min_bytes) {
  if (!a.mapping->contains(offset, std::max<uint64_t>(min_bytes, limits::entry_header_bytes))) {
    return nullptr;
  }
  return reinterpret_cast<const shm::EntryHeader*>(a.mapping->data() + offset);
}

bool header_names(const shm::EntryHeader& h, const kvpark_client* client, kvpark::EntryKind kind,
                  const Hash128& key) {
  return h.magic == shm::entry_magic && h.format_version == shm::entry_format_version &&
         h.kind == static_cast<uint8_t>(kind) && h.namespace_id == client->namespace_id &&
         h.key_hash == key;
}

const int32_t* entry_tokens(const Attachment& a, uint64_t offset) {
  return reinterpret_cast<const int32_t*>(a.mapping->data() + offset + limits::entry_header_bytes);
}

// Whether block `index` of a reply carries our block's header and the prompt's
// exact token ids. The daemon found it by hash and wrote its header itself, so a
// mismatch means another process wrote over it.
bool block_intact(const kvpark_client* client, const Attachment& a, uint64_t offset,
                  const Hash128& hash, const int32_t* block_tokens_ids) {
  const uint32_t block_tokens = client->geometry.block_tokens;
  const shm::EntryHeader* h = entry_at(a, offset, a.hello.block_extent_bytes);
  return h != nullptr && header_names(*h, client, kvpark::EntryKind::Block, hash) &&
         h->token_count == block_tokens && h->payload_offset == a.hello.block_payload_offset &&
         h->payload_bytes == client->geometry.block_payload_bytes &&
         std::memcmp(entry_tokens(a, offset), block_tokens_ids, block_tokens * sizeof(int32_t)) == 0;
}

void report_corrupt(kvpark_plan* plan, uint64_t extent) noexcept;

// Blocks of the reply whose header and token ids match the prompt exactly. Past the
// first that does not, every altered one is reported, so one re-publish repairs all.
size_t confirm_blocks(kvpark_plan* plan, const wire::LookupReply& reply,
                      const std::vector<Hash128>& hashes, const int32_t* tokens) {
  const kvpark_client* client = plan->client;
  const Attachment& a = plan->attachment;
  const uint32_t block_tokens = client->geometry.block_tokens;
  const size_t n = std::min(reply.block_offsets.size(), hashes.size());
  size_t confirmed = 0;
  while (confirmed < n && block_intact(client, a, reply.block_offsets[confirmed], hashes[confirmed],
                                       tokens + confirmed * block_tokens)) {
    ++confirmed;
  }
  for (size_t i = confirmed; i < n; ++i) {
    if (!block_intact(client, a, reply.block_offsets[i], hashes[i], tokens + i * block_tokens)) {
      report_corrupt(plan, reply.block_offsets[i]);
    }
  }
  return confirmed;
}

// Turns a LOOKUP or WAIT answer into the plan: only entries readable now and
// confirmed against the prompt count as restorable; promoted ones as pending.
void apply_reply(kvpark_plan* plan, const wire::LookupReply& reply,
                 const std::vector<Hash128>& hashes, const int32_t* tokens, size_t n_tokens) {
  const kvpark_client* client = plan->client;
  const Attachment& a = plan->attachment;
  const uint32_t chain = client->chain_tokens;
  const size_t chunks = n_tokens / chain;
  const uint32_t block_tokens = client->geometry.block_tokens;
  const bool snapshot_required = client->geometry.snapshot_required;
  wire::LookupReply ready = reply;
  ready.block_offsets.resize(reply.host_blocks);
  const size_t confirmed = confirm_blocks(plan, ready, hashes, tokens);
  const uint32_t block_restorable =
      snapshot_required ? 0 : static_cast<uint32_t>(confirmed * block_tokens);
  size_t blocks_used = snapshot_required ? 0 : confirmed;
  plan->blocks.clear();
  plan->block_extents.clear();
  plan->block_checksums.clear();
  plan->block_verified.clear();
  plan->snapshot = nullptr;
  plan->snapshot_verified = false;
  plan->snapshot_bytes = 0;
  plan->snapshot_position = 0;
  plan->restorable_tokens = block_restorable;
  plan->reuse_kind = block_restorable > 0 ? static_cast<kvpark_reuse_kind>(reply.reuse_kind)
                                          : KVPARK_REUSE_ROOT;
  plan->block_reuse_kind = plan->reuse_kind;
  uint32_t pending = reply.restorable_tokens;
  for (const wire::SnapshotCandidate& c : reply.snapshots) {
    const uint64_t tail = uint64_t{c.position} - uint64_t{c.anchor_chunks} * chain;
    if (c.position <= block_restorable || c.position >= n_tokens || c.anchor_chunks > chunks ||
        tail >= chain || (block_tokens > 0 && c.anchor_chunks > reply.block_offsets.size())) {
      continue;
    }
    if (c.ready == 0) {
      pending = std::max(pending, c.position);
      continue;
    }
    if (block_tokens > 0 && c.anchor_chunks > confirmed) {
      // Its blocks are still coming in from disk: restorable once they land. (A host
      // block that failed confirmation ends the chain here for good.)
      if (confirmed == reply.host_blocks) pending = std::max(pending, c.position);
      continue;
    }
    const Hash128& anchor = c.anchor_chunks == 0 ? client->namespace_id
                                                 : hashes[c.anchor_chunks - 1];
    const shm::EntryHeader* h = entry_at(a, c.extent_offset, 0);
    if (h == nullptr || !header_names(*h, client, kvpark::EntryKind::Snapshot, anchor) ||
        h->position != c.position || h->anchor_chunks != c.anchor_chunks ||
        h->token_count != tail || h->payload_offset != shm::payload_offset_for(h->token_count) ||
        !a.mapping->contains(c.extent_offset, uint64_t{h->payload_offset} + h->payload_bytes)) {
      // The daemon wrote this header and named the candidate: a mismatch is a header
      // written over after seal.
      report_corrupt(plan, c.extent_offset);
      continue;
    }
    // A tail the daemon could not compare (the prompt runs past its chunk) may
    // simply differ: a miss, not damage.
    if (std::memcmp(entry_tokens(a, c.extent_offset), tokens + uint64_t{c.anchor_chunks} * chain,
                    tail * sizeof(int32_t)) != 0) {
      continue;
    }
    plan->snapshot = a.mapping->data() + c.extent_offset + h->payload_offset;
    plan->snapshot_extent = c.extent_offset;
    plan->snapshot_checksum = c.payload_checksum;
    plan->snapshot_bytes = h->payload_bytes;
    plan->snapshot_position = c.position;
    plan->restorable_tokens = c.position;
    plan->reuse_kind = static_cast<kvpark_reuse_kind>(c.reuse_kind);
    blocks_used = block_tokens > 0 ? c.anchor_chunks : 0;
    break;  // candidates come deepest first
  }
  for (size_t i = 0; i < blocks_used; ++i) {
    plan->blocks.push_back(a.mapping->data() + reply.block_offsets[i] +
                           a.hello.block_payload_offset);
    plan->block_extents.push_back(reply.block_offsets[i]);
    plan->block_checksums.push_back(reply.block_checksums[i]);
    plan->block_verified.push_back(0);
  }
  plan->inflight_tokens = reply.inflight_tokens;
  plan->capture_hint_tokens = reply.capture_hint_tokens;
  // Pending: what a WAIT may still add (nothing once everything settled).
  plan->pending_tokens =
      reply.host_blocks < reply.block_offsets.size() || pending > plan->restorable_tokens
          ? std::max(pending, plan->restorable_tokens)
          : plan->restorable_tokens;
  bool snapshots_pending = false;
  for (const wire::SnapshotCandidate& c : reply.snapshots) snapshots_pending |= c.ready == 0;
  if (reply.host_blocks == reply.block_offsets.size() && !snapshots_pending) {
    plan->pending_tokens = plan->restorable_tokens;
  }
}

// LOOKUP into `plan` (fresh, or one whose lease is being replaced after a WAIT).
Status lookup_into(kvpark_client* client, uint64_t session_id, const int32_t* tokens,
                   size_t n_tokens, kvpark_plan* plan) {
  const uint32_t chain = client->chain_tokens;
  const size_t chunks = n_tokens / chain;
  wire::LookupRequest request;
  request.session_id = session_id;
  request.prompt_tokens = static_cast<uint32_t>(n_tokens);
  request.chunk_hashes = hash_chunks(client, tokens, chunks);
  request.tail_tokens.assign(tokens + chunks * chain, tokens + n_tokens);
  std::vector<uint8_t> frame;
  wire::encode(request, 0, frame);
  std::vector<uint8_t> body;
  Attachment a;
  const bool opens_grant = !plan->counted_open;
  if (Status s = call(client, frame, 0, body, a, opens_grant); s != Status::Ok) return s;
  plan->client = client;  // release closes the count on it even if decoding fails
  plan->counted_open = true;
  GrantGuard granted(client);
  wire::LookupReply reply;
  if (wire::decode(body, reply) != Status::Ok) return Status::ProtocolError;
  plan->attachment = a;
  plan->lease_id = reply.lease_id;
  granted.dismiss();
  plan->session_id = session_id;
  apply_reply(plan, reply, request.chunk_hashes, tokens, n_tokens);
  if (plan->pending_tokens > plan->restorable_tokens || plan->inflight_tokens > 0) {
    // WAIT confirms promoted entries, or looks up again, against the same prompt.
    if (plan->tokens.data() != tokens) plan->tokens.assign(tokens, tokens + n_tokens);
    plan->hashes = std::move(request.chunk_hashes);
  } else {
    plan->tokens.clear();
    plan->hashes.clear();
  }
  return Status::Ok;
}

// The entry at `extent` failed its checksum: tell the daemon (one way), which drops it.
// Advisory: a report lost to a failed allocation only means the next reader finds it too.
void report_corrupt(kvpark_plan* plan, uint64_t extent) noexcept {
  if (plan->lease_id == 0) return;
  try {
    std::vector<uint8_t> frame;
    wire::encode(wire::CorruptReport{.lease_id = plan->lease_id, .extent_offset = extent}, 0, frame);
    (void)plan->client->channel.send_one_way(frame, plan->attachment.generation);
  } catch (...) {
  }
}

// Block `index` failed: the plan keeps blocks [0, index) and no snapshot (it needs
// every block before it); a namespace that restores only through snapshots keeps nothing.
// The blocks after it are checked in place too, so every altered one is reported now
// and a single re-publish repairs the chain.
void truncate_at_block(kvpark_plan* plan, size_t index) {
  report_corrupt(plan, plan->block_extents[index]);
  for (size_t i = index + 1; i < plan->blocks.size(); ++i) {
    if (kvpark::client::payload_checksum(plan->blocks[i], plan->client->geometry.block_payload_bytes) !=
        plan->block_checksums[i]) {
      report_corrupt(plan, plan->block_extents[i]);
    }
  }
  const kvpark::Geometry& g = plan->client->geometry;
  const size_t keep = g.snapshot_required ? 0 : index;
  plan->blocks.resize(keep);
  plan->block_extents.resize(keep);
  plan->block_checksums.resize(keep);
  plan->block_verified.resize(keep);
  if (plan->block_reads.size() > keep) plan->block_reads.resize(keep);
  plan->snapshot = nullptr;
  plan->snapshot_bytes = 0;
  plan->snapshot_position = 0;
  plan->restorable_tokens = static_cast<uint32_t>(keep * g.block_tokens);
  plan->reuse_kind = keep > 0 ? plan->block_reuse_kind : KVPARK_REUSE_ROOT;
  plan->pending_tokens = plan->restorable_tokens;
}

// The snapshot failed: the plan keeps its blocks where they restore on their own.
void drop_snapshot(kvpark_plan* plan) {
  report_corrupt(plan, plan->snapshot_extent);
  const kvpark::Geometry& g = plan->client->geometry;
  if (g.snapshot_required) {
    plan->blocks.clear();
    plan->block_extents.clear();
    plan->block_checksums.clear();
    plan->block_verified.clear();
  }
  plan->snapshot = nullptr;
  plan->snapshot_bytes = 0;
  plan->snapshot_position = 0;
  plan->restorable_tokens = static_cast<uint32_t>(plan->blocks.size() * g.block_tokens);
  plan->reuse_kind = plan->restorable_tokens > 0 ? plan->block_reuse_kind : KVPARK_REUSE_ROOT;
  plan->pending_tokens = plan->restorable_tokens;
}

// The checksum of the snapshot bytes a copy wrote, against the sealed one: on a
// mismatch the snapshot is dropped and the copy must not be used.
kvpark_status snapshot_verdict(kvpark_plan* plan, uint64_t checksum) {
  if (checksum == plan->snapshot_checksum) return KVPARK_OK;
  drop_snapshot(plan);
  return KVPARK_CORRUPT;
}

// Ends a lease superseded by a new lookup (nothing was restored from it).
void release_lease_one_way(kvpark_plan* plan) {
  if (plan->lease_id == 0) return;
  std::vector<uint8_t>& frame = plan->release_frame;
  frame.clear();
  wire::encode(wire::ReleaseRequest{plan->lease_id, 0}, 0, frame, wire::Verb::ReleaseOneWay);
  // One way: nothing the daemon could answer changes what the engine does next. A
  // newer daemon incarnation never saw this lease; nothing to release there.
  (void)plan->client->channel.send_one_way(frame, plan->attachment.generation);
  plan->lease_id = 0;
}

// Frees a plan or reservation that never reached the caller, ending what the
// daemon granted for it (both are noexcept: their bodies catch).
struct PlanRelease {
  void operator()(kvpark_plan* plan) const { kvpark_plan_release(plan); }
};
struct ReservationAbort {
  void operator()(kvpark_reservation* r) const { (void)kvpark_abort(r); }
};

// After a failed WAIT: a plan that may be half updated promises nothing restorable.
void forget_restorable(kvpark_plan* plan) noexcept {
  plan->blocks.clear();
  plan->snapshot = nullptr;
  plan->snapshot_bytes = 0;
  plan->snapshot_position = 0;
  plan->restorable_tokens = 0;
  plan->pending_tokens = 0;
  plan->inflight_tokens = 0;
  plan->capture_hint_tokens = 0;
  plan->reuse_kind = KVPARK_REUSE_ROOT;
}

}  // namespace

// The C boundary (client/c_boundary.h): every body that can throw catches.
extern "C" {

const char* kvpark_status_string(kvpark_status status) {
  if (!kvpark::status_is_known(static_cast<uint16_t>(status))) return "unknown status";
  return kvpark::status_name(static_cast<Status>(status)).data();
}

kvpark_status kvpark_connect(const char* socket_path, const kvpark_namespace* ns,
                             kvpark_client** ret_client) {
  return kvpark_connect_with_reply_timeout(socket_path, ns, 0, ret_client);
}

kvpark_status kvpark_connect_with_reply_timeout(const char* socket_path, const kvpark_namespace* ns,
                                                uint32_t reply_timeout_msec,
                                                kvpark_client** ret_client) try {
  if (ns == nullptr || ret_client == nullptr) return KVPARK_INVALID_ARGUMENT;
  if (reply_timeout_msec == 0) reply_timeout_msec = kvpark::client::reply_timeout_msec;
  if (reply_timeout_msec < uint32_t(kvpark::client::reply_timeout_msec_min) ||
      reply_timeout_msec > limits::wait_timeout_msec_max)
    return KVPARK_INVALID_ARGUMENT;
  wire::HelloRequest hello;
  hello.protocol_version = limits::protocol_version;
  hello.namespace_id = {ns->id.low, ns->id.high};
  hello.geometry = {.block_tokens = ns->block_tokens,
                    .block_payload_bytes = ns->block_payload_bytes,
                    .snapshot_required = ns->snapshot_required != 0};
  hello.prefill_tokens_per_second = ns->prefill_tokens_per_second;
  hello.client_name = ns->client_name != nullptr ? ns->client_name : "";
  if (hello.client_name.size() > limits::client_name_bytes_max) {
    hello.client_name.resize(limits::client_name_bytes_max);
  }
  std::string path = socket_path != nullptr ? socket_path : kvpark::default_socket_path();
  auto client = std::make_unique<kvpark_client>(std::move(path), hello, int(reply_timeout_msec));
  Attachment attachment;
  if (Status s = client->channel.connect(attachment); s != Status::Ok) return to_c(s);
  client->chain_tokens = attachment.hello.chain_tokens;
  if (client->chain_tokens == 0 ||
      (ns->block_tokens != 0 && client->chain_tokens != ns->block_tokens)) {
    return KVPARK_PROTOCOL_ERROR;
  }
  *ret_client = client.release();
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

void kvpark_disconnect(kvpark_client* client) { delete client; }

uint32_t kvpark_chain_tokens(const kvpark_client* client) { return client->chain_tokens; }

void kvpark_chain_hashes(kvpark_hash128 seed, const int32_t* tokens, uint32_t chunk_tokens,
                         size_t chunks, kvpark_hash128* ret_hashes) try {
  kvpark::client::chain_hashes({seed.low, seed.high}, {tokens, chunks * chunk_tokens},
                               chunk_tokens,
                               {reinterpret_cast<Hash128*>(ret_hashes), chunks});
} catch (...) {
  std::memset(ret_hashes, 0, chunks * sizeof *ret_hashes);  // kvpark.h: zeros, no chain
}


kvpark_status kvpark_lookup(kvpark_client* client, uint64_t session_id, const int32_t* tokens,
                            size_t n_tokens, kvpark_plan** ret_plan) try {
  if (client == nullptr || tokens == nullptr || ret_plan == nullptr || n_tokens == 0) {
    return KVPARK_INVALID_ARGUMENT;
  }
  if (n_tokens > limits::lookup_tokens_max ||
      n_tokens / client->chain_tokens > limits::lookup_chunks_max) {
    return KVPARK_LIMIT_EXCEEDED;
  }
  // Released (its lease too, if one was granted) when anything below fails.
  std::unique_ptr<kvpark_plan, PlanRelease> plan(new kvpark_plan());
  plan->release_frame.reserve(release_frame_bytes);
  if (Status s = lookup_into(client, session_id, tokens, n_tokens, plan.get()); s != Status::Ok) {
    return to_c(s);
  }
  *ret_plan = plan.release();
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

uint32_t kvpark_plan_pending_tokens(const kvpark_plan* plan) { return plan->pending_tokens; }
uint32_t kvpark_plan_inflight_tokens(const kvpark_plan* plan) { return plan->inflight_tokens; }
uint32_t kvpark_plan_capture_hint(const kvpark_plan* plan) { return plan->capture_hint_tokens; }

kvpark_status kvpark_plan_wait(kvpark_plan* plan, uint32_t timeout_msec) try {
  if (plan == nullptr || timeout_msec > limits::wait_timeout_msec_max) {
    return KVPARK_INVALID_ARGUMENT;
  }
  if (plan->pending_tokens <= plan->restorable_tokens && plan->inflight_tokens == 0) {
    return KVPARK_OK;
  }
  // The daemon ends a wait for another engine's prefill once waiting costs more than
  // prefilling would; the WAITs go in slices below, so the bound is kept here too.
  uint64_t wait_msec = timeout_msec;
  const uint32_t rate = plan->client->prefill_tokens_per_second;
  if (plan->inflight_tokens > 0 && rate > 0) {
    wait_msec = std::min(wait_msec, (uint64_t{plan->inflight_tokens} * 1000 + rate - 1) / rate);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_msec);
  int lookups_again = 0;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const auto slice =
        static_cast<uint32_t>(std::clamp<int64_t>(left.count(), 0, limits::wait_slice_msec));
    std::vector<uint8_t> frame, body;
    wire::encode(wire::WaitRequest{.lease_id = plan->lease_id, .timeout_msec = slice}, 0, frame);
    Attachment ignored;
    Status answer = Status::Ok;
    Status s =
        plan->client->channel.call(frame, plan->attachment.generation, answer, body, ignored);
    if (s != Status::Ok) return to_c(s);  // the daemon went away: an error, not a hang
    if (answer != Status::Ok && answer != Status::Timeout) return to_c(answer);
    wire::LookupReply reply;
    if (wire::decode(body, reply) != Status::Ok) return KVPARK_PROTOCOL_ERROR;
    if (answer == Status::Ok && plan->inflight_tokens > 0) {
      // The engine we waited for sealed (or gave up), or the remote store's part came
      // in: look the prompt up again.
      const std::vector<int32_t> tokens = std::move(plan->tokens);
      release_lease_one_way(plan);
      s = lookup_into(plan->client, plan->session_id, tokens.data(), tokens.size(), plan);
      if (s != Status::Ok) plan->lease_id = 0;
      // The new lease may wait on more (the remote store's tail snapshot that continues
      // the blocks just brought in): waited for too, while time is left.
      const bool settled =
          plan->inflight_tokens == 0 && plan->pending_tokens <= plan->restorable_tokens;
      if (s != Status::Ok || settled || ++lookups_again >= lookups_per_wait_max ||
          std::chrono::steady_clock::now() >= deadline) {
        return to_c(s);
      }
      continue;
    }
    apply_reply(plan, reply, plan->hashes, plan->tokens.data(), plan->tokens.size());
    if (answer == Status::Ok || slice == 0 || std::chrono::steady_clock::now() >= deadline) {
      return to_c(answer);
    }
  }
} catch (...) {
  forget_restorable(plan);  // it may be half updated: it promises nothing now
  return status_of_current_exception();
}

uint32_t kvpark_plan_restorable_tokens(const kvpark_plan* plan) { return plan->restorable_tokens; }
kvpark_reuse_kind kvpark_plan_reuse_kind(const kvpark_plan* plan) { return plan->reuse_kind; }
size_t kvpark_plan_block_count(const kvpark_plan* plan) { return plan->blocks.size(); }

// The pointer accessors are const in the C ABI but may shrink the plan when a payload
// fails its check: the plan is always one this library allocated, never const itself.
const void* kvpark_plan_block(const kvpark_plan* const_plan, size_t index) {
  auto* plan = const_cast<kvpark_plan*>(const_plan);
  if (index >= plan->blocks.size()) return nullptr;
  if (plan->block_verified[index] == 0) {
    if (kvpark::client::payload_checksum(plan->blocks[index],
                                         plan->client->geometry.block_payload_bytes) !=
        plan->block_checksums[index]) {
      truncate_at_block(plan, index);
      return nullptr;
    }
    plan->block_verified[index] = 1;
  }
  return plan->blocks[index];
}

const void* kvpark_plan_snapshot(const kvpark_plan* const_plan, uint64_t* ret_bytes,
                                 uint32_t* ret_position) {
  auto* plan = const_cast<kvpark_plan*>(const_plan);
  if (plan->snapshot == nullptr) return nullptr;
  if (!plan->snapshot_verified) {
    if (kvpark::client::payload_checksum(plan->snapshot, plan->snapshot_bytes) !=
        plan->snapshot_checksum) {
      drop_snapshot(plan);
      return nullptr;
    }
    plan->snapshot_verified = true;
  }
  if (ret_bytes != nullptr) *ret_bytes = plan->snapshot_bytes;
  if (ret_position != nullptr) *ret_position = plan->snapshot_position;
  return plan->snapshot;
}

kvpark_status kvpark_plan_copy_block(kvpark_plan* plan, size_t index, void* dst) try {
  if (plan == nullptr || dst == nullptr || index >= plan->blocks.size()) {
    return KVPARK_INVALID_ARGUMENT;
  }
  plan->attachment.mapping->prefault(plan->blocks[index], plan->client->geometry.block_payload_bytes);
  if (kvpark::client::copy_checksum(dst, plan->blocks[index],
                                    plan->client->geometry.block_payload_bytes) !=
      plan->block_checksums[index]) {
    truncate_at_block(plan, index);
    return KVPARK_CORRUPT;
  }
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

kvpark_status kvpark_plan_copy_snapshot(kvpark_plan* plan, void* dst, uint64_t bytes) try {
  if (plan == nullptr || dst == nullptr || plan->snapshot == nullptr ||
      bytes != plan->snapshot_bytes) {
    return KVPARK_INVALID_ARGUMENT;
  }
  const uint64_t checksum = copy_prefaulted(plan->attachment, plan->snapshot, bytes, [&] {
    return kvpark::client::copy_checksum(dst, plan->snapshot, bytes);
  });
  return snapshot_verdict(plan, checksum);
} catch (...) {
  return status_of_current_exception();
}

uint64_t kvpark_plan_snapshot_bytes(const kvpark_plan* plan, uint32_t* ret_position) {
  const bool has = plan != nullptr && plan->snapshot != nullptr;
  if (ret_position != nullptr) *ret_position = has ? plan->snapshot_position : 0;
  return has ? plan->snapshot_bytes : 0;
}

kvpark_status kvpark_plan_read_snapshot(kvpark_plan* plan, uint64_t offset, void* dst,
                                        uint64_t bytes) try {
  if (plan == nullptr || plan->snapshot == nullptr || (dst == nullptr && bytes > 0) ||
      offset > plan->snapshot_bytes || bytes > plan->snapshot_bytes - offset) {
    return KVPARK_INVALID_ARGUMENT;
  }
  if (offset == 0) {
    // Parts land in a buffer the caller reads at once (kvpark-proxy's staging buffer):
    // through the cache, where it stays.
    plan->snapshot_read =
        std::make_unique<kvpark::client::StreamingChecksum>(kvpark::client::CopyStores::cached);
  } else if (!plan->snapshot_read || plan->snapshot_read->bytes() != offset) {
    return KVPARK_INVALID_ARGUMENT;
  }
  plan->attachment.mapping->prefault(plan->snapshot + offset, bytes);
  plan->snapshot_read->copy(dst, plan->snapshot + offset, bytes);
  if (offset + bytes < plan->snapshot_bytes) return KVPARK_OK;
  const uint64_t checksum = plan->snapshot_read->digest();
  plan->snapshot_read.reset();
  return snapshot_verdict(plan, checksum);
} catch (...) {
  return status_of_current_exception();
}

kvpark_status kvpark_plan_read_block(kvpark_plan* plan, size_t index, uint64_t offset, void* dst,
                                     uint64_t bytes) try {
  if (plan == nullptr || index >= plan->blocks.size()) return KVPARK_INVALID_ARGUMENT;
  const uint64_t block_bytes = plan->client->geometry.block_payload_bytes;
  if ((dst == nullptr && bytes > 0) || offset > block_bytes || bytes > block_bytes - offset) {
    return KVPARK_INVALID_ARGUMENT;
  }
  if (plan->block_reads.size() < plan->blocks.size()) plan->block_reads.resize(plan->blocks.size());
  std::unique_ptr<kvpark::client::StreamingChecksum>& read = plan->block_reads[index];
  if (offset == 0) {
    read = std::make_unique<kvpark::client::StreamingChecksum>(kvpark::client::CopyStores::cached);
  } else if (!read || read->bytes() != offset) {
    return KVPARK_INVALID_ARGUMENT;
  }
  const uint8_t* src = plan->blocks[index] + offset;
  plan->attachment.mapping->prefault(src, bytes);
  read->copy(dst, src, bytes);
  if (offset + bytes < block_bytes) return KVPARK_OK;
  const uint64_t checksum = read->digest();
  read.reset();
  if (checksum != plan->block_checksums[index]) {
    truncate_at_block(plan, index);
    return KVPARK_CORRUPT;
  }
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

void kvpark_plan_set_restored_tokens(kvpark_plan* plan, uint32_t tokens) {
  if (plan != nullptr) plan->restored_tokens = tokens;
}

void kvpark_plan_release(kvpark_plan* plan) try {
  if (plan == nullptr) return;
  assert(!kvpark::client::handle_has_transfer_in_flight(plan) &&
         "kvpark_plan_release while a device transfer still reads the plan");
  if (plan->counted_open) {
    plan->counted_open = false;
    plan->client->channel.grant_closed();
  }
  if (plan->lease_id != 0) {
    std::vector<uint8_t>& frame = plan->release_frame;
    frame.clear();
    wire::encode(wire::ReleaseRequest{plan->lease_id, plan->restored_tokens}, 0, frame,
                 wire::Verb::ReleaseOneWay);
    // One way: nothing the daemon could answer changes what the engine does next. A
    // newer daemon incarnation never saw this lease; nothing to release there.
    (void)plan->client->channel.send_one_way(frame, plan->attachment.generation);
  }
  delete plan;
} catch (...) {
  delete plan;  // the lease, if unsent, ends with the connection
}

kvpark_status kvpark_reserve_blocks(kvpark_client* client, const kvpark_publish_options* options,
                                    const int32_t* tokens, size_t n_tokens, size_t first_block,
                                    size_t block_count, kvpark_reservation** ret_reservation) try {
  if (client == nullptr || options == nullptr || tokens == nullptr ||
      ret_reservation == nullptr || client->geometry.block_tokens == 0 || block_count == 0) {
    return KVPARK_INVALID_ARGUMENT;
  }
  if (block_count > limits::reserve_blocks_max) return KVPARK_LIMIT_EXCEEDED;
  const uint32_t block_tokens = client->geometry.block_tokens;
  const size_t end_block = first_block + block_count;
  if (end_block * block_tokens > n_tokens || end_block * block_tokens > limits::lookup_tokens_max) {
    return KVPARK_INVALID_ARGUMENT;
  }
  const std::vector<Hash128> hashes = hash_chunks(client, tokens, end_block);
  wire::ReserveBlocksRequest request;
  request.options = {.session_id = options->session_id,
                     .entry_class = static_cast<uint8_t>(options->entry_class),
                     .evidence = static_cast<uint8_t>(options->evidence)};
  request.first_chunk = static_cast<uint32_t>(first_block);
  request.parent_hash = first_block == 0 ? client->namespace_id : hashes[first_block - 1];
  request.chunk_hashes.assign(hashes.begin() + first_block, hashes.end());
  std::vector<uint8_t> frame, body;
  wire::encode(request, 0, frame);
  // Made before the call: once it is answered, the reservation is counted open.
  std::unique_ptr<kvpark_reservation, ReservationAbort> r(new kvpark_reservation());
  r->finish_frame.reserve(id_frame_bytes);
  Attachment a;
  if (Status s = call(client, frame, 0, body, a, true); s != Status::Ok) return to_c(s);
  r->client = client;
  r->counted_open = true;
  GrantGuard granted(client);
  wire::ReserveBlocksReply reply;
  if (wire::decode(body, reply) != Status::Ok || reply.grants.size() != block_count) {
    return KVPARK_PROTOCOL_ERROR;
  }
  r->attachment = a;
  r->reservation_id = reply.reservation_id;
  r->block_bytes = client->geometry.block_payload_bytes;
  granted.dismiss();
  Status status = Status::Ok;
  for (size_t i = 0; i < block_count; ++i) {
    const wire::BlockGrant& g = reply.grants[i];
    if (g.disposition != static_cast<uint32_t>(wire::Disposition::Reserved)) {
      r->blocks.push_back(nullptr);
      continue;
    }
    // Pair assertion with the daemon's reserve: the extent must carry our block's header.
    const shm::EntryHeader* h = entry_at(a, g.extent_offset, a.hello.block_extent_bytes);
    if (h == nullptr ||
        !header_names(*h, client, kvpark::EntryKind::Block, hashes[first_block + i])) {
      status = Status::Corrupt;
      break;
    }
    uint8_t* extent = a.mapping->data() + g.extent_offset;
    std::memcpy(extent + limits::entry_header_bytes, tokens + (first_block + i) * block_tokens,
                block_tokens * sizeof(int32_t));
    r->blocks.push_back(extent + a.hello.block_payload_offset);
  }
  r->block_checksums.assign(r->blocks.size(), 0);
  r->block_checksummed.assign(r->blocks.size(), 0);
  // SEAL must not allocate: its checksums and frame get their room now.
  r->finish_checksums.reserve(r->blocks.size());
  r->finish_frame.reserve(id_frame_bytes + 8 + r->blocks.size() * sizeof(uint64_t));
  if (status != Status::Ok) return to_c(status);
  *ret_reservation = r.release();
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

size_t kvpark_reservation_block_count(const kvpark_reservation* r) { return r->blocks.size(); }

void* kvpark_reservation_block(const kvpark_reservation* const_r, size_t index) {
  if (index >= const_r->blocks.size()) return nullptr;
  // The caller may write through the pointer: checksum it again at seal.
  const_cast<kvpark_reservation*>(const_r)->block_checksummed[index] = 0;
  return const_r->blocks[index];
}

kvpark_status kvpark_reservation_write_block(kvpark_reservation* r, size_t index, const void* src) {
  if (r == nullptr || src == nullptr || index >= r->blocks.size() || r->blocks[index] == nullptr) {
    return KVPARK_INVALID_ARGUMENT;
  }
  r->attachment.mapping->prefault(r->blocks[index], r->block_bytes);
  r->block_checksums[index] = kvpark::client::copy_checksum(r->blocks[index], src, r->block_bytes);
  r->block_checksummed[index] = 1;
  return KVPARK_OK;
}

kvpark_status kvpark_reserve_snapshot(kvpark_client* client, const kvpark_publish_options* options,
                                      const int32_t* tokens, size_t n_tokens,
                                      uint64_t payload_bytes,
                                      kvpark_reservation** ret_reservation) try {
  if (client == nullptr || options == nullptr || tokens == nullptr ||
      ret_reservation == nullptr || n_tokens == 0 || payload_bytes == 0) {
    return KVPARK_INVALID_ARGUMENT;
  }
  if (n_tokens > limits::lookup_tokens_max) return KVPARK_LIMIT_EXCEEDED;
  const uint32_t chain = client->chain_tokens;
  const size_t anchor_chunks = n_tokens / chain;
  const std::vector<Hash128> hashes = hash_chunks(client, tokens, anchor_chunks);
  wire::ReserveSnapshotRequest request;
  request.options = {.session_id = options->session_id,
                     .entry_class = static_cast<uint8_t>(options->entry_class),
                     .evidence = static_cast<uint8_t>(options->evidence)};
  request.anchor_chunks = static_cast<uint32_t>(anchor_chunks);
  request.anchor_hash = anchor_chunks == 0 ? client->namespace_id : hashes.back();
  request.payload_bytes = payload_bytes;
  request.tail_tokens.assign(tokens + anchor_chunks * chain, tokens + n_tokens);
  std::vector<uint8_t> frame, body;
  wire::encode(request, 0, frame);
  // Made before the call: once it is answered, the reservation is counted open.
  std::unique_ptr<kvpark_reservation, ReservationAbort> r(new kvpark_reservation());
  r->finish_frame.reserve(id_frame_bytes);
  Attachment a;
  if (Status s = call(client, frame, 0, body, a, true); s != Status::Ok) return to_c(s);
  r->client = client;
  r->counted_open = true;
  GrantGuard granted(client);
  wire::ReserveSnapshotReply reply;
  if (wire::decode(body, reply) != Status::Ok) return KVPARK_PROTOCOL_ERROR;
  if (reply.disposition == static_cast<uint32_t>(wire::Disposition::Present)) {
    return KVPARK_ALREADY_PRESENT;
  }
  if (reply.disposition == static_cast<uint32_t>(wire::Disposition::InFlight)) {
    return KVPARK_IN_FLIGHT;
  }
  r->attachment = a;
  r->reservation_id = reply.reservation_id;
  granted.dismiss();
  const shm::EntryHeader* h = entry_at(a, reply.extent_offset, reply.extent_bytes);
  if (h == nullptr ||
      !header_names(*h, client, kvpark::EntryKind::Snapshot, request.anchor_hash) ||
      h->payload_bytes != payload_bytes || h->payload_offset != reply.payload_offset ||
      uint64_t{reply.payload_offset} + payload_bytes > reply.extent_bytes) {
    return KVPARK_CORRUPT;
  }
  r->snapshot = a.mapping->data() + reply.extent_offset + reply.payload_offset;
  r->snapshot_bytes = payload_bytes;
  r->finish_checksums.reserve(1);
  r->finish_frame.reserve(id_frame_bytes + 8 + sizeof(uint64_t));
  *ret_reservation = r.release();
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

void* kvpark_reservation_snapshot(const kvpark_reservation* const_r) {
  // The caller may write through the pointer: checksum it again at seal.
  if (const_r->snapshot != nullptr) const_cast<kvpark_reservation*>(const_r)->snapshot_out_of_order = true;
  return const_r->snapshot;
}

kvpark_status kvpark_reservation_write_snapshot(kvpark_reservation* r, uint64_t offset,
                                                const void* src, uint64_t bytes) try {
  if (r == nullptr || r->snapshot == nullptr || (src == nullptr && bytes > 0) ||
      offset > r->snapshot_bytes || bytes > r->snapshot_bytes - offset) {
    return KVPARK_INVALID_ARGUMENT;
  }
  if (!r->snapshot_stream && offset == 0) {
    r->snapshot_stream = std::make_unique<kvpark::client::StreamingChecksum>();
  }
  copy_prefaulted(r->attachment, r->snapshot + offset, bytes, [&] {
    if (r->snapshot_stream && offset == r->snapshot_stream->bytes()) {
      r->snapshot_stream->copy(r->snapshot + offset, src, bytes);
    } else {
      std::memcpy(r->snapshot + offset, src, bytes);
      r->snapshot_out_of_order = true;
    }
    return 0;
  });
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

static kvpark_status finish_reservation(kvpark_reservation* r, wire::Verb verb) try {
  if (r == nullptr) return KVPARK_INVALID_ARGUMENT;
  assert(!kvpark::client::handle_has_transfer_in_flight(r) &&
         "kvpark_seal/kvpark_abort while a device transfer still writes the reservation");
  // Nothing writes into its extents any more: a reconnection need not hold them.
  if (r->counted_open) {
    r->counted_open = false;
    r->client->channel.grant_closed();
  }
  Status s = Status::Ok;
  if (r->reservation_id != 0) {
    std::vector<uint8_t>& frame = r->finish_frame;
    std::vector<uint8_t> body;  // stays empty: SEAL and ABORT answer with a bare header
    frame.clear();
    wire::ReservationRequest request{.reservation_id = r->reservation_id};
    if (verb == wire::Verb::Seal) {
      // In grant order, one per payload the daemon reserved for us (room taken at reserve).
      std::vector<uint64_t>& sums = r->finish_checksums;
      sums.clear();
      for (size_t i = 0; i < r->blocks.size(); ++i) {
        if (r->blocks[i] == nullptr) continue;
        sums.push_back(r->block_checksummed[i] != 0
                           ? r->block_checksums[i]
                           : kvpark::client::payload_checksum(r->blocks[i], r->block_bytes));
      }
      if (r->snapshot != nullptr) {
        const bool streamed = r->snapshot_stream && !r->snapshot_out_of_order &&
                              r->snapshot_stream->bytes() == r->snapshot_bytes;
        sums.push_back(streamed ? r->snapshot_stream->digest()
                                : kvpark::client::payload_checksum(r->snapshot, r->snapshot_bytes));
      }
      request.payload_checksums = std::move(sums);
    }
    wire::encode(verb, request, 0, frame);
    Attachment ignored;
    s = call(r->client, frame, r->attachment.generation, body, ignored);
  }
  delete r;
  return to_c(s);
} catch (...) {
  delete r;  // an unsent abort or seal ends with the connection: the daemon aborts it
  return status_of_current_exception();
}

kvpark_status kvpark_seal(kvpark_reservation* r) { return finish_reservation(r, wire::Verb::Seal); }
kvpark_status kvpark_abort(kvpark_reservation* r) { return finish_reservation(r, wire::Verb::Abort); }

kvpark_status kvpark_get_stats(kvpark_client* client, kvpark_stats* ret_stats) try {
  if (client == nullptr || ret_stats == nullptr) return KVPARK_INVALID_ARGUMENT;
  std::vector<uint8_t> frame, body;
  wire::encode(static_cast<uint16_t>(wire::Verb::Stats), 0, 0, frame);
  Attachment a;
  if (Status s = call(client, frame, 0, body, a); s != Status::Ok) return to_c(s);
  wire::StatsReply reply;
  if (wire::decode(body, reply) != Status::Ok) return KVPARK_PROTOCOL_ERROR;
  std::memcpy(ret_stats, &reply, sizeof reply);
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

}  // extern "C"

// Accessors for the device API (client/device_access.h).
namespace kvpark::client {
Geometry client_geometry(const kvpark_client* client) { return client->geometry; }
HandleView plan_view(const kvpark_plan* plan) { return {plan->client, &plan->attachment}; }
HandleView reservation_view(const kvpark_reservation* reservation) {
  return {reservation->client, &reservation->attachment};
}
}  // namespace kvpark::client
