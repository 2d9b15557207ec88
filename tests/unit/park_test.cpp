// Park, in process over a heap buffer as the arena: dedup, eviction order,
// leases, restorable-position rules, per-connection limits and close() cleanup.
#include "daemon/park.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "daemon/adoption.h"
#include "daemon/clock.h"
#include "daemon/entry_state.h"
#include "proto/limits.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {
namespace {

constexpr uint64_t granule = limits::extent_align_bytes;
constexpr uint32_t block_tokens = 16;
constexpr uint64_t block_payload_bytes = 1024;
// Arena sizes below are counted in blocks of this many bytes.
constexpr uint64_t block_extent = shm::extent_bytes_for(block_tokens, block_payload_bytes);
constexpr NamespaceId attention_ns{0xa77e, 1};
constexpr NamespaceId hybrid_ns{0x4b1d, 2};
constexpr NamespaceId snapshot_only_ns{0x5a0, 3};

Hash128 chain_hash(uint64_t chain, size_t index) { return {chain * 1000 + index + 1, chain}; }
std::vector<Hash128> chain(uint64_t chain_id, size_t count) {
  std::vector<Hash128> out;
  for (size_t i = 0; i < count; ++i) out.push_back(chain_hash(chain_id, i));
  return out;
}

// A SEAL for a reservation: one payload checksum per reserved extent.
wire::ReservationRequest sealing(const wire::ReserveBlocksReply& reply) {
  wire::ReservationRequest req{.reservation_id = reply.reservation_id};
  for (const wire::BlockGrant& g : reply.grants) {
    if (g.disposition == static_cast<uint32_t>(wire::Disposition::Reserved)) {
      req.payload_checksums.push_back(0x5eed + req.payload_checksums.size());
    }
  }
  return req;
}
wire::ReservationRequest sealing(const wire::ReserveSnapshotReply& reply) {
  return {.reservation_id = reply.reservation_id, .payload_checksums = {0x5eed}};
}

class ParkTest : public ::testing::Test {
 protected:
  void make(uint64_t data_blocks, uint64_t reservation_bytes_max = 0, size_t connections_max = 8,
            uint64_t unsealed_connection_bytes_max = 0, uint64_t unsealed_uid_bytes_max = 0) {
    arena_.assign(data_blocks * block_extent, 0);
    table_ = std::make_unique<EntryTable>(arena_.size(), granule);
    park_ = std::make_unique<Park>(
        ParkOptions{.arena_data = arena_.data(),
                    .arena_data_bytes = arena_.size(),
                    .incarnation = 0x1234,
                    .reservation_bytes_max =
                        reservation_bytes_max ? reservation_bytes_max : arena_.size(),
                    .unsealed_connection_bytes_max = unsealed_connection_bytes_max,
                    .unsealed_uid_bytes_max = unsealed_uid_bytes_max,
                    .connections_max = connections_max},
        *table_);
  }
  void SetUp() override { make(16); }
  // The same with a state segment, as kvparkd keeps one in the service manager's fd store.
  void make_with_state(uint64_t data_blocks) {
    arena_.assign(data_blocks * block_extent, 0);
    int err = 0;
    ASSERT_EQ(shm::StateSegment::create({.arena_identity = 0x1234,
                                         .arena_data_bytes = arena_.size(),
                                         .configured_arena_bytes = arena_.size()},
                                        segment_, err),
              Status::Ok);
    start_park();
  }
  // A restart that adopts: a new Park over the same arena and the kept state segment,
  // holding what it adopted for the previous instance's engines `pids` until deadline_usec.
  AdoptionReport restart_adopting(const std::vector<uint32_t>& pids, uint64_t deadline_usec) {
    park_.reset();
    table_.reset();
    state_.reset();
    std::unique_ptr<shm::StateSegment> kept;
    int err = 0;
    EXPECT_EQ(shm::StateSegment::adopt(dup(segment_->fd()), kept, err), Status::Ok);
    segment_ = std::move(kept);
    start_park();
    const AdoptionReport report = adopt_entries(*state_, arena_.data(), arena_.size(), *table_);
    park_->hold_adopted(pids, deadline_usec);
    return report;
  }
  void start_park() {
    state_ = std::make_unique<EntryState>(*segment_);
    table_ = std::make_unique<EntryTable>(arena_.size(), granule);
    table_->set_state(state_.get());
    park_ = std::make_unique<Park>(ParkOptions{.arena_data = arena_.data(),
                                               .arena_data_bytes = arena_.size(),
                                               .incarnation = 0x1234,
                                               .reservation_bytes_max = arena_.size(),
                                               .connections_max = 8,
                                               .state = state_.get()},
                                   *table_);
  }

  ConnectionId connect(const NamespaceId& ns = attention_ns, uint32_t bt = block_tokens,
                       bool snapshot_required = false, uint32_t uid = 0) {
    const ConnectionId id = next_id_++;
    EXPECT_EQ(park_->open(id, 100 + id, uid), Status::Ok);
    wire::HelloRequest hello;
    hello.protocol_version = limits::protocol_version;
    hello.namespace_id = ns;
    hello.geometry = {.block_tokens = bt,
                      .block_payload_bytes = bt == 0 ? 0 : block_payload_bytes,
                      .snapshot_required = snapshot_required};
    wire::HelloReply reply;
    EXPECT_EQ(park_->hello(id, hello, reply), Status::Ok);
    return id;
  }

  Status reserve(ConnectionId c, const std::vector<Hash128>& hashes, uint32_t first_chunk,
                 wire::ReserveBlocksReply& reply, uint64_t session = 1,
                 EntryClass cls = EntryClass::Private) {
    wire::ReserveBlocksRequest req;
    req.options = {.session_id = session, .entry_class = static_cast<uint8_t>(cls)};
    req.first_chunk = first_chunk;
    req.chunk_hashes = hashes;
    return park_->reserve_blocks(c, req, reply);
  }
  // Reserves and seals blocks [first, first + hashes.size()) of a chain.
  void publish(ConnectionId c, const std::vector<Hash128>& hashes, uint32_t first_chunk = 0,
               uint64_t session = 1, EntryClass cls = EntryClass::Private) {
    wire::ReserveBlocksReply reply;
    ASSERT_EQ(reserve(c, hashes, first_chunk, reply, session, cls), Status::Ok);
    if (reply.reservation_id != 0) {
      ASSERT_EQ(park_->seal(c, sealing(reply)), Status::Ok);
    }
  }
  Status reserve_snapshot(ConnectionId c, uint32_t anchor_chunks, const Hash128& anchor,
                          std::vector<int32_t> tail, wire::ReserveSnapshotReply& reply,
                          uint64_t payload_bytes = 100) {
    wire::ReserveSnapshotRequest req;
    req.options.session_id = 1;
    req.anchor_chunks = anchor_chunks;
    req.anchor_hash = anchor;
    req.payload_bytes = payload_bytes;
    req.tail_tokens = std::move(tail);
    return park_->reserve_snapshot(c, req, reply);
  }
  void publish_snapshot(ConnectionId c, uint32_t anchor_chunks, const Hash128& anchor,
                        std::vector<int32_t> tail) {
    wire::ReserveSnapshotReply reply;
    ASSERT_EQ(reserve_snapshot(c, anchor_chunks, anchor, std::move(tail), reply), Status::Ok);
    ASSERT_EQ(reply.disposition, 0u);
    ASSERT_EQ(park_->seal(c, sealing(reply)), Status::Ok);
  }
  // A LOOKUP for a prompt of `whole` chunks of `hashes` plus `tail` tokens.
  Status lookup(ConnectionId c, const std::vector<Hash128>& hashes, std::vector<int32_t> tail,
                wire::LookupReply& reply, uint32_t chain_tokens = block_tokens,
                uint64_t session = 1) {
    wire::LookupRequest req;
    req.session_id = session;
    req.chunk_hashes = hashes;
    req.prompt_tokens = static_cast<uint32_t>(hashes.size() * chain_tokens + tail.size());
    req.tail_tokens = std::move(tail);
    return park_->lookup(c, req, reply);
  }
  bool present(const NamespaceId& ns, const Hash128& h) {
    for (NamespaceIndex i = 0; i < table_->namespace_count(); ++i) {
      if (table_->namespace_info(i).id == ns) {
        const EntrySlot s = table_->find_block(i, h);
        return s != no_slot && table_->entry(s).sealed;
      }
    }
    return false;
  }

  std::vector<uint8_t> arena_;
  std::unique_ptr<shm::StateSegment> segment_;  // make_with_state
  std::unique_ptr<EntryState> state_;
  std::unique_ptr<EntryTable> table_;
  std::unique_ptr<Park> park_;
  ConnectionId next_id_ = 1;
};

TEST_F(ParkTest, StoresIdenticalBlocksOnceAcrossConnections) {
  const ConnectionId a = connect(), b = connect();
  const auto hashes = chain(1, 3);
  wire::ReserveBlocksReply ra, rb;
  ASSERT_EQ(reserve(a, hashes, 0, ra), Status::Ok);
  ASSERT_NE(ra.reservation_id, 0u);
  ASSERT_EQ(reserve(b, hashes, 0, rb), Status::Ok);
  EXPECT_EQ(rb.reservation_id, 0u) << "nothing for b to write while a writes";
  for (const auto& g : rb.grants) EXPECT_EQ(g.disposition, uint32_t(wire::Disposition::InFlight));
  ASSERT_EQ(park_->seal(a, sealing(ra)), Status::Ok);
  ASSERT_EQ(reserve(b, hashes, 0, rb), Status::Ok);
  EXPECT_EQ(rb.reservation_id, 0u);
  for (const auto& g : rb.grants) EXPECT_EQ(g.disposition, uint32_t(wire::Disposition::Present));
  EXPECT_EQ(table_->blocks(), 3u);
  EXPECT_EQ(park_->stats().dedup_hits, 3u);
  EXPECT_EQ(table_->bytes_free(), 13 * block_extent);
}

TEST_F(ParkTest, ReservesOnlyTheMissingBlocksOfAPartlyParkedChain) {
  const ConnectionId a = connect();
  const auto hashes = chain(1, 4);
  publish(a, {hashes[0], hashes[1]});
  wire::ReserveBlocksReply r;
  ASSERT_EQ(reserve(a, hashes, 0, r), Status::Ok);
  ASSERT_EQ(r.grants.size(), 4u);
  EXPECT_EQ(r.grants[0].disposition, uint32_t(wire::Disposition::Present));
  EXPECT_EQ(r.grants[1].disposition, uint32_t(wire::Disposition::Present));
  EXPECT_EQ(r.grants[2].disposition, uint32_t(wire::Disposition::Reserved));
  EXPECT_EQ(r.grants[3].disposition, uint32_t(wire::Disposition::Reserved));
  EXPECT_NE(r.grants[2].extent_offset, r.grants[3].extent_offset);
}

TEST_F(ParkTest, RepeatedHashInOneReserveIsWrittenOnce) {
  const ConnectionId a = connect();
  wire::ReserveBlocksReply r;
  ASSERT_EQ(reserve(a, {chain_hash(1, 0), chain_hash(1, 0)}, 0, r), Status::Ok);
  EXPECT_EQ(r.grants[0].disposition, uint32_t(wire::Disposition::Reserved));
  EXPECT_EQ(r.grants[1].disposition, uint32_t(wire::Disposition::InFlight));
  EXPECT_EQ(table_->bytes_free(), 15 * block_extent);
}

TEST_F(ParkTest, WritesEntryHeaderAtReserveAndChecksItAtSeal) {
  const ConnectionId a = connect();
  wire::ReserveBlocksReply r;
  ASSERT_EQ(reserve(a, chain(1, 1), 0, r), Status::Ok);
  shm::EntryHeader h;
  std::memcpy(&h, arena_.data() + r.grants[0].extent_offset, sizeof h);
  EXPECT_EQ(h.magic, shm::entry_magic);
  EXPECT_EQ(h.key_hash, chain_hash(1, 0));
  EXPECT_EQ(h.namespace_id, attention_ns);
  EXPECT_EQ(h.token_count, block_tokens);
  EXPECT_EQ(h.payload_bytes, block_payload_bytes);
  arena_[r.grants[0].extent_offset + 20] ^= 1;  // a client scribbles on the header
  EXPECT_EQ(park_->seal(a, sealing(r)), Status::Corrupt);
  EXPECT_FALSE(present(attention_ns, chain_hash(1, 0)));
  EXPECT_EQ(table_->bytes_free(), 16 * block_extent);
  EXPECT_EQ(park_->stats().reservations, 0u);
}

// Chains are sealed and leased deepest first, so a chain's root is its most
// recently used entry and eviction takes a chain from its tip.
TEST_F(ParkTest, EvictsDeepestBlocksFirstAndRootsLast) {
  make(8);
  const ConnectionId a = connect();
  const auto old_chain = chain(1, 4), new_chain = chain(2, 4);
  publish(a, old_chain);
  publish(a, new_chain);
  ASSERT_EQ(table_->bytes_free(), 0u);
  publish(a, chain(3, 1));
  EXPECT_FALSE(present(attention_ns, old_chain[3])) << "the old chain's tip goes first";
  EXPECT_TRUE(present(attention_ns, old_chain[2]));
  publish(a, chain(4, 2));
  EXPECT_FALSE(present(attention_ns, old_chain[2]));
  EXPECT_FALSE(present(attention_ns, old_chain[1]));
  EXPECT_TRUE(present(attention_ns, old_chain[0])) << "the root is evicted last";
  for (const Hash128& h : new_chain) EXPECT_TRUE(present(attention_ns, h));
}

TEST_F(ParkTest, LookupMakesAChainMostRecent) {
  make(8);
  const ConnectionId a = connect();
  const auto old_chain = chain(1, 4), new_chain = chain(2, 4);
  publish(a, old_chain);
  publish(a, new_chain);
  wire::LookupReply reply;
  ASSERT_EQ(lookup(a, old_chain, {1}, reply), Status::Ok);
  ASSERT_EQ(park_->release(a, {reply.lease_id}), Status::Ok);
  publish(a, chain(3, 1));
  EXPECT_FALSE(present(attention_ns, new_chain[3])) << "the unused chain is now the oldest";
  for (const Hash128& h : old_chain) EXPECT_TRUE(present(attention_ns, h));
}

TEST_F(ParkTest, LeasesBlockEviction) {
  make(8);
  const ConnectionId a = connect(), b = connect();
  const auto leased = chain(1, 4), other = chain(2, 4);
  publish(a, leased);
  publish(a, other);
  wire::LookupReply plan;
  ASSERT_EQ(lookup(b, leased, {7}, plan), Status::Ok);
  ASSERT_EQ(plan.block_offsets.size(), 4u);
  // The lease takes `leased` off the LRU list: `other` is evicted instead.
  publish(a, chain(3, 4));
  for (const Hash128& h : leased) EXPECT_TRUE(present(attention_ns, h));
  for (const Hash128& h : other) EXPECT_FALSE(present(attention_ns, h));
  // Now 4 leased + 4 evictable: five more blocks can never fit while the lease holds.
  wire::ReserveBlocksReply r;
  EXPECT_EQ(reserve(a, chain(4, 5), 0, r), Status::ArenaFull);
  EXPECT_EQ(r.reservation_id, 0u);
  ASSERT_EQ(park_->release(b, {plan.lease_id}), Status::Ok);
  EXPECT_EQ(reserve(a, chain(4, 5), 0, r), Status::Ok);
}

// Regression: a RESERVE refused with ArenaFull counted the blocks it found present as
// dedup hits, though the writer was told nothing of them and wrote nothing less.
TEST_F(ParkTest, ARefusedReserveCountsNoDedupHits) {
  make(8);
  const ConnectionId a = connect(), b = connect();
  publish(a, chain(1, 4));
  publish(a, chain(2, 4));
  wire::LookupReply first, second;
  ASSERT_EQ(lookup(b, chain(1, 4), {7}, first), Status::Ok);
  ASSERT_EQ(lookup(b, chain(2, 4), {7}, second), Status::Ok);
  // chain(1, 8): four blocks present, four new ones, and no room while b leases all.
  wire::ReserveBlocksReply r;
  EXPECT_EQ(reserve(a, chain(1, 8), 0, r), Status::ArenaFull);
  EXPECT_EQ(park_->stats().dedup_hits, 0u);
  ASSERT_EQ(park_->release(b, {second.lease_id}), Status::Ok);
  ASSERT_EQ(reserve(a, chain(1, 8), 0, r), Status::Ok);
  EXPECT_EQ(park_->stats().dedup_hits, 4u);
}

// Regression: a multi-block RESERVE that could never fit used to evict every
// evictable entry, one block at a time, before failing with ArenaFull.
TEST_F(ParkTest, AdoptedEntriesAreHeldUntilTheGraceDeadlineAndNotOneMicrosecondLonger) {
  make_with_state(8);
  const ConnectionId a = connect();
  const auto parked = chain(1, 8);  // fills the arena
  publish(a, parked);
  constexpr uint64_t deadline_usec = 5'000'000'000;  // the test drives the clock
  // The previous instance's engine (this process) has not come back.
  const AdoptionReport report =
      restart_adopting({static_cast<uint32_t>(getpid())}, deadline_usec);
  ASSERT_EQ(report.entries, 8u);
  ASSERT_TRUE(park_->adoption_held());
  const ConnectionId b = connect();  // a new engine
  wire::ReserveBlocksReply r;
  EXPECT_EQ(reserve(b, chain(2, 1), 0, r), Status::ArenaFull);  // nothing adopted is evictable
  park_->tick_at(deadline_usec - 1);
  EXPECT_TRUE(park_->adoption_held());
  EXPECT_EQ(reserve(b, chain(2, 1), 0, r), Status::ArenaFull);
  for (const Hash128& h : parked) EXPECT_TRUE(present(attention_ns, h));
  park_->tick_at(deadline_usec);
  EXPECT_FALSE(park_->adoption_held());
  EXPECT_EQ(reserve(b, chain(2, 1), 0, r), Status::Ok);  // evicts one adopted block
  EXPECT_EQ(table_->evictions(), 1u);
}

TEST_F(ParkTest, EvictingAnAdoptedEntryUnderTheHoldKeepsItsExtentTakenUntilTheHoldEnds) {
  make_with_state(8);
  const auto parked = chain(1, 8);  // fills the arena
  publish(connect(), parked);
  constexpr uint64_t deadline_usec = 5'000'000'000;
  restart_adopting({static_cast<uint32_t>(getpid())}, deadline_usec);
  ASSERT_TRUE(park_->adoption_held());
  // The operator evicts the chain's tip (kvparkctl evict), then drops the namespace.
  const EntrySlot tip = table_->find_block(0, parked.back());
  ASSERT_NE(tip, no_slot);
  const uint64_t tip_offset = table_->entry(tip).extent_offset;
  ASSERT_EQ(park_->evict_entry(tip), Status::Ok);
  EXPECT_FALSE(present(attention_ns, parked.back()));  // never served again
  uint64_t dropped = 0;
  ASSERT_EQ(park_->drop_namespace(attention_ns, dropped), Status::Ok);
  EXPECT_EQ(dropped, 7u);
  for (const Hash128& h : parked) EXPECT_FALSE(present(attention_ns, h));
  // An engine of the previous instance may still be copying out of those extents:
  // nobody gets them yet.
  const ConnectionId b = connect(hybrid_ns);
  wire::ReserveBlocksReply r;
  EXPECT_EQ(reserve(b, chain(2, 1), 0, r), Status::ArenaFull);
  EXPECT_EQ(table_->bytes_free(), 0u);
  park_->tick_at(deadline_usec);
  ASSERT_FALSE(park_->adoption_held());
  EXPECT_EQ(table_->bytes_free(), arena_.size());
  ASSERT_EQ(reserve(b, chain(2, 8), 0, r), Status::Ok);  // the whole arena, nothing evicted
  EXPECT_EQ(table_->evictions(), 0u);
  bool tip_extent_reused = false;
  for (const wire::BlockGrant& g : r.grants) tip_extent_reused |= g.extent_offset == tip_offset;
  EXPECT_TRUE(tip_extent_reused);
}

TEST_F(ParkTest, AdoptionHoldEndsWhenTheLastPreviousEngineSaysHelloAgain) {
  make_with_state(8);
  publish(connect(), chain(1, 8));
  restart_adopting({static_cast<uint32_t>(getpid())}, UINT64_MAX);
  ASSERT_TRUE(park_->adoption_held());
  const ConnectionId back = next_id_++;
  ASSERT_EQ(park_->open(back, static_cast<uint32_t>(getpid())), Status::Ok);
  wire::HelloRequest hello;
  hello.protocol_version = limits::protocol_version;
  hello.namespace_id = attention_ns;
  hello.geometry = {.block_tokens = block_tokens, .block_payload_bytes = block_payload_bytes};
  wire::HelloReply reply;
  ASSERT_EQ(park_->hello(back, hello, reply), Status::Ok);
  EXPECT_FALSE(park_->adoption_held());
}

TEST_F(ParkTest, AnEngineBackWithPlansOfThePreviousInstanceKeepsTheHoldUntilItsGrace) {
  make_with_state(8);
  publish(connect(), chain(1, 8));
  constexpr uint64_t deadline_usec = 5'000'000'000;
  restart_adopting({static_cast<uint32_t>(getpid())}, deadline_usec);
  ASSERT_TRUE(park_->adoption_held());
  // One thread of the engine reconnects while another may still copy out of a plan
  // of the previous instance: the adopted extents stay held.
  wire::HelloRequest hello;
  hello.protocol_version = limits::protocol_version;
  hello.namespace_id = attention_ns;
  hello.geometry = {.block_tokens = block_tokens, .block_payload_bytes = block_payload_bytes};
  hello.holds_earlier_grants = true;
  wire::HelloReply reply;
  const ConnectionId back = next_id_++;
  ASSERT_EQ(park_->open(back, static_cast<uint32_t>(getpid())), Status::Ok);
  ASSERT_EQ(park_->hello(back, hello, reply), Status::Ok);
  EXPECT_TRUE(park_->adoption_held());
  // Another client of the same process, holding nothing, cannot speak for it.
  hello.holds_earlier_grants = false;
  const ConnectionId other = next_id_++;
  ASSERT_EQ(park_->open(other, static_cast<uint32_t>(getpid())), Status::Ok);
  ASSERT_EQ(park_->hello(other, hello, reply), Status::Ok);
  EXPECT_TRUE(park_->adoption_held());
  park_->tick_at(deadline_usec - 1);  // it is alive: held until the grace passes
  EXPECT_TRUE(park_->adoption_held());
  const ConnectionId b = connect(hybrid_ns);
  wire::ReserveBlocksReply r;
  EXPECT_EQ(reserve(b, chain(2, 1), 0, r), Status::ArenaFull);
  park_->tick_at(deadline_usec);
  EXPECT_FALSE(park_->adoption_held());
  EXPECT_EQ(reserve(b, chain(2, 1), 0, r), Status::Ok);
}

TEST_F(ParkTest, ReserveThatCanNeverFitKeepsParkedEntries) {
  make(8, /*reservation_bytes_max=*/64 * block_extent);
  const ConnectionId a = connect();
  const auto parked = chain(1, 4);
  publish(a, parked);
  wire::ReserveBlocksReply r;
  EXPECT_EQ(reserve(a, chain(2, 9), 0, r), Status::ArenaFull);
  EXPECT_EQ(table_->evictions(), 0u);
  for (const Hash128& h : parked) EXPECT_TRUE(present(attention_ns, h));
  EXPECT_EQ(table_->bytes_free(), 4 * block_extent);
  EXPECT_EQ(park_->stats().reservations, 0u);
  // Exactly the arena's size fits, by evicting what is parked.
  EXPECT_EQ(reserve(a, chain(2, 8), 0, r), Status::Ok);
}

TEST_F(ParkTest, AttentionRestoresWholeBlocksLeavingOneToken) {
  const ConnectionId a = connect();
  const auto hashes = chain(1, 3);
  publish(a, hashes);
  wire::LookupReply reply;
  // Prompt exactly at a block boundary: the last block is left to prefill.
  ASSERT_EQ(lookup(a, hashes, {}, reply), Status::Ok);
  EXPECT_EQ(reply.restorable_tokens, 2 * block_tokens);
  EXPECT_EQ(reply.block_offsets.size(), 2u);
  // One token past the boundary: every block is restorable.
  ASSERT_EQ(lookup(a, hashes, {5}, reply), Status::Ok);
  EXPECT_EQ(reply.restorable_tokens, 3 * block_tokens);
  EXPECT_EQ(reply.block_offsets.size(), 3u);
  // A one-block prompt restores nothing.
  ASSERT_EQ(lookup(a, {hashes[0]}, {}, reply), Status::Ok);
  EXPECT_EQ(reply.restorable_tokens, 0u);
  EXPECT_EQ(reply.lease_id, 0u);
  EXPECT_EQ(reply.reuse_kind, uint8_t(ReuseKind::Root));
}

TEST_F(ParkTest, AttentionStopsAtTheFirstMissingBlock) {
  const ConnectionId a = connect();
  const auto hashes = chain(1, 4);
  publish(a, {hashes[0]}, 0);
  publish(a, {hashes[2], hashes[3]}, 2);
  wire::LookupReply reply;
  ASSERT_EQ(lookup(a, hashes, {1}, reply), Status::Ok);
  EXPECT_EQ(reply.restorable_tokens, block_tokens);
  ASSERT_EQ(reply.block_offsets.size(), 1u);
}

TEST_F(ParkTest, UnsealedBlocksAreNotRestorable) {
  const ConnectionId a = connect();
  const auto hashes = chain(1, 2);
  wire::ReserveBlocksReply r;
  ASSERT_EQ(reserve(a, hashes, 0, r), Status::Ok);
  wire::LookupReply reply;
  ASSERT_EQ(lookup(a, hashes, {1}, reply), Status::Ok);
  EXPECT_EQ(reply.restorable_tokens, 0u);
  EXPECT_EQ(reply.lease_id, 0u);
}

TEST_F(ParkTest, ReportsReuseKindBySessionAndClass) {
  const ConnectionId a = connect();
  publish(a, chain(1, 2), 0, /*session=*/7);
  publish(a, chain(2, 2), 0, /*session=*/7, EntryClass::Shared);
  wire::LookupReply reply;
  ASSERT_EQ(lookup(a, chain(1, 2), {1}, reply, block_tokens, 7), Status::Ok);
  EXPECT_EQ(reply.reuse_kind, uint8_t(ReuseKind::PrivateTurnClosure));
  ASSERT_EQ(lookup(a, chain(1, 2), {1}, reply, block_tokens, 8), Status::Ok);
  EXPECT_EQ(reply.reuse_kind, uint8_t(ReuseKind::SharedStablePrefix));
  ASSERT_EQ(lookup(a, chain(2, 2), {1}, reply, block_tokens, 7), Status::Ok);
  EXPECT_EQ(reply.reuse_kind, uint8_t(ReuseKind::SharedStablePrefix));
}

TEST_F(ParkTest, SnapshotRequiredNamespaceNeedsASnapshot) {
  const ConnectionId a = connect(hybrid_ns, block_tokens, true);
  const auto hashes = chain(1, 3);
  publish(a, hashes);
  wire::LookupReply reply;
  ASSERT_EQ(lookup(a, hashes, {1, 2, 3, 4}, reply), Status::Ok);
  EXPECT_EQ(reply.restorable_tokens, 0u) << "blocks alone never restore a hybrid model";
  EXPECT_TRUE(reply.block_offsets.empty());
  EXPECT_TRUE(reply.snapshots.empty());
  EXPECT_EQ(reply.lease_id, 0u);
  EXPECT_EQ(park_->stats().leases, 0u);
}

TEST_F(ParkTest, SnapshotRestoresWithAllEarlierBlocks) {
  const ConnectionId a = connect(hybrid_ns, block_tokens, true);
  const auto hashes = chain(1, 3);
  publish(a, hashes);
  publish_snapshot(a, 2, hashes[1], {9, 9, 9, 9, 9});  // position 37
  wire::LookupReply reply;
  ASSERT_EQ(lookup(a, hashes, {1, 2, 3, 4}, reply), Status::Ok);  // 52 tokens
  ASSERT_EQ(reply.snapshots.size(), 1u);
  EXPECT_EQ(reply.snapshots[0].position, 2 * block_tokens + 5);
  EXPECT_EQ(reply.snapshots[0].anchor_chunks, 2u);
  EXPECT_EQ(reply.block_offsets.size(), 2u) << "exactly the blocks before the snapshot";
  EXPECT_EQ(reply.restorable_tokens, 0u);
  EXPECT_NE(reply.lease_id, 0u);
  EXPECT_EQ(park_->stats().lookup_hit_tokens, 37u);
}

TEST_F(ParkTest, SnapshotWithAMissingEarlierBlockIsNotOffered) {
  const ConnectionId a = connect(hybrid_ns, block_tokens, true);
  const auto hashes = chain(1, 3);
  publish(a, {hashes[0]});
  publish(a, {hashes[2]}, 2);
  publish_snapshot(a, 2, hashes[1], {9, 9});
  wire::LookupReply reply;
  ASSERT_EQ(lookup(a, hashes, {1}, reply), Status::Ok);
  EXPECT_TRUE(reply.snapshots.empty());
  EXPECT_TRUE(reply.block_offsets.empty());
  EXPECT_EQ(reply.lease_id, 0u);
}

TEST_F(ParkTest, SnapshotAtThePromptsEndLeavesNothingToPrefillAndIsNotOffered) {
  const ConnectionId a = connect(hybrid_ns, block_tokens, true);
  const auto hashes = chain(1, 2);
  publish(a, hashes);
  publish_snapshot(a, 2, hashes[1], {4, 5, 6});
  wire::LookupReply reply;
  ASSERT_EQ(lookup(a, hashes, {4, 5, 6}, reply), Status::Ok);
  EXPECT_TRUE(reply.snapshots.empty()) << "position == prompt_tokens";
  ASSERT_EQ(lookup(a, hashes, {4, 5, 6, 7}, reply), Status::Ok);
  ASSERT_EQ(reply.snapshots.size(), 1u);
  EXPECT_EQ(reply.snapshots[0].position, 35u);
  // A tail that differs inside the last chunk does not match.
  ASSERT_EQ(lookup(a, hashes, {4, 5, 7, 7}, reply), Status::Ok);
  EXPECT_TRUE(reply.snapshots.empty());
}

TEST_F(ParkTest, SnapshotOnlyNamespaceOffersDeepestSnapshotFirst) {
  const ConnectionId a = connect(snapshot_only_ns, 0, true);
  const uint32_t chain_tokens = limits::snapshot_chain_tokens;
  const auto hashes = chain(1, 2);
  publish_snapshot(a, 0, snapshot_only_ns, {1, 2, 3});
  publish_snapshot(a, 1, hashes[0], {4, 5});
  wire::LookupReply reply;
  ASSERT_EQ(lookup(a, hashes, {8}, reply, chain_tokens), Status::Ok);
  ASSERT_EQ(reply.snapshots.size(), 2u);
  EXPECT_EQ(reply.snapshots[0].position, chain_tokens + 2);
  EXPECT_EQ(reply.snapshots[1].position, 3u);
  EXPECT_TRUE(reply.block_offsets.empty());
  // Blocks cannot be reserved in a snapshot-only namespace.
  wire::ReserveBlocksReply r;
  EXPECT_EQ(reserve(a, hashes, 0, r), Status::InvalidArgument);
}

TEST_F(ParkTest, SnapshotDedupAndInFlight) {
  const ConnectionId a = connect(), b = connect();
  wire::ReserveSnapshotReply ra, rb;
  ASSERT_EQ(reserve_snapshot(a, 0, attention_ns, {1, 2}, ra), Status::Ok);
  ASSERT_EQ(ra.disposition, uint32_t(wire::Disposition::Reserved));
  ASSERT_EQ(reserve_snapshot(b, 0, attention_ns, {1, 2}, rb), Status::Ok);
  EXPECT_EQ(rb.disposition, uint32_t(wire::Disposition::InFlight));
  EXPECT_EQ(rb.reservation_id, 0u);
  ASSERT_EQ(park_->seal(a, sealing(ra)), Status::Ok);
  ASSERT_EQ(reserve_snapshot(b, 0, attention_ns, {1, 2}, rb), Status::Ok);
  EXPECT_EQ(rb.disposition, uint32_t(wire::Disposition::Present));
  // Anchor 0 must name the namespace seed.
  EXPECT_EQ(reserve_snapshot(b, 0, {1, 1}, {1, 2}, rb), Status::InvalidArgument);
}

TEST_F(ParkTest, CloseReturnsEveryByteAndLease) {
  const ConnectionId keeper = connect();
  publish(keeper, chain(1, 4));
  const uint64_t baseline_free = table_->bytes_free();
  const uint64_t baseline_evictable = table_->evictable_bytes();
  const size_t baseline_connections = park_->connection_count();

  const ConnectionId c = connect();
  wire::ReserveBlocksReply rb;
  ASSERT_EQ(reserve(c, chain(2, 3), 0, rb), Status::Ok);
  wire::ReserveSnapshotReply rs;
  ASSERT_EQ(reserve_snapshot(c, 1, chain_hash(1, 0), {5}, rs, 3 * block_extent), Status::Ok);
  wire::LookupReply l1, l2;
  ASSERT_EQ(lookup(c, chain(1, 4), {1}, l1), Status::Ok);
  ASSERT_EQ(lookup(c, chain(1, 2), {1}, l2), Status::Ok);
  auto stats = park_->stats();
  EXPECT_EQ(stats.leases, 2u);
  EXPECT_EQ(stats.reservations, 2u);
  EXPECT_LT(table_->bytes_free(), baseline_free);
  EXPECT_EQ(table_->evictable_bytes(), 0u) << "every parked block is leased";

  park_->close(c);
  stats = park_->stats();
  EXPECT_EQ(stats.leases, 0u);
  EXPECT_EQ(stats.reservations, 0u);
  EXPECT_EQ(park_->connection_count(), baseline_connections);
  EXPECT_EQ(table_->bytes_free(), baseline_free);
  EXPECT_EQ(table_->evictable_bytes(), baseline_evictable);
  EXPECT_FALSE(present(attention_ns, chain_hash(2, 0)));
  park_->close(c);  // idempotent
  EXPECT_EQ(park_->connection_count(), baseline_connections);
}

TEST_F(ParkTest, VerbsBeforeHelloAreBadState) {
  ASSERT_EQ(park_->open(50, 1), Status::Ok);
  wire::LookupReply l;
  wire::LookupRequest req;
  req.prompt_tokens = 1;
  req.tail_tokens = {1};
  EXPECT_EQ(park_->lookup(50, req, l), Status::BadState);
  EXPECT_EQ(park_->release(50, {1}), Status::BadState);
  EXPECT_EQ(park_->seal(50, {.reservation_id = 1}), Status::BadState);
  EXPECT_EQ(park_->abort(50, {1}), Status::BadState);
  wire::ReserveBlocksReply r;
  wire::ReserveBlocksRequest rreq;
  rreq.chunk_hashes = chain(1, 1);
  EXPECT_EQ(park_->reserve_blocks(50, rreq, r), Status::BadState);
}

TEST_F(ParkTest, SecondHelloIsBadState) {
  const ConnectionId a = connect();
  wire::HelloRequest hello;
  hello.protocol_version = limits::protocol_version;
  hello.namespace_id = hybrid_ns;
  hello.geometry = {.block_tokens = 16, .block_payload_bytes = 1024};
  wire::HelloReply reply;
  EXPECT_EQ(park_->hello(a, hello, reply), Status::BadState);
}

TEST_F(ParkTest, HelloGreetsTheOldestSupportedProtocol) {
  ASSERT_EQ(park_->open(63, 1), Status::Ok);
  wire::HelloRequest hello;
  hello.protocol_version = limits::protocol_version_min;
  hello.namespace_id = attention_ns;
  hello.geometry = {.block_tokens = block_tokens, .block_payload_bytes = block_payload_bytes};
  wire::HelloReply reply;
  EXPECT_EQ(park_->hello(63, hello, reply), Status::Ok);
}

TEST_F(ParkTest, HelloChecksVersionAndGeometry) {
  ASSERT_EQ(park_->open(60, 1), Status::Ok);
  wire::HelloRequest hello;
  hello.protocol_version = limits::protocol_version + 1;
  hello.namespace_id = attention_ns;
  hello.geometry = {.block_tokens = block_tokens, .block_payload_bytes = block_payload_bytes};
  wire::HelloReply reply;
  EXPECT_EQ(park_->hello(60, hello, reply), Status::InvalidArgument);
  hello.protocol_version = limits::protocol_version_min - 1;
  EXPECT_EQ(park_->hello(60, hello, reply), Status::InvalidArgument);
  hello.protocol_version = limits::protocol_version;
  ASSERT_EQ(park_->hello(60, hello, reply), Status::Ok);
  EXPECT_EQ(reply.chain_tokens, block_tokens);
  EXPECT_EQ(reply.block_extent_bytes, block_extent);
  EXPECT_EQ(reply.block_payload_offset, shm::payload_offset_for(block_tokens));
  ASSERT_EQ(park_->open(61, 1), Status::Ok);
  hello.geometry.block_payload_bytes *= 2;
  EXPECT_EQ(park_->hello(61, hello, reply), Status::GeometryMismatch);
}

TEST_F(ParkTest, ConnectionsAtCapAndCapPlusOne) {
  make(16, 0, /*connections_max=*/3);
  EXPECT_EQ(park_->open(1, 1), Status::Ok);
  EXPECT_EQ(park_->open(2, 1), Status::Ok);
  EXPECT_EQ(park_->open(3, 1), Status::Ok);
  EXPECT_EQ(park_->open(4, 1), Status::LimitExceeded);
  park_->close(2);
  EXPECT_EQ(park_->open(5, 1), Status::Ok);
}

TEST_F(ParkTest, LeasesPerConnectionAtCapAndCapPlusOne) {
  const ConnectionId a = connect(), b = connect();
  const auto hashes = chain(1, 1);
  publish(a, hashes);
  std::vector<uint64_t> leases;
  wire::LookupReply reply;
  for (size_t i = 0; i < limits::leases_per_connection_max; ++i) {
    ASSERT_EQ(lookup(a, hashes, {1}, reply), Status::Ok) << i;
    ASSERT_NE(reply.lease_id, 0u);
    leases.push_back(reply.lease_id);
  }
  EXPECT_EQ(lookup(a, hashes, {1}, reply), Status::LimitExceeded);
  EXPECT_EQ(lookup(b, hashes, {1}, reply), Status::Ok) << "the cap is per connection";
  ASSERT_EQ(park_->release(a, {leases.back()}), Status::Ok);
  EXPECT_EQ(park_->release(a, {leases.back()}), Status::NotFound);
  EXPECT_EQ(lookup(a, hashes, {1}, reply), Status::Ok);
  EXPECT_EQ(lookup(a, hashes, {1}, reply), Status::LimitExceeded);
}

TEST_F(ParkTest, ReservationsPerConnectionAtCapAndCapPlusOne) {
  make(limits::reservations_per_connection_max + 8);
  const ConnectionId a = connect();
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < limits::reservations_per_connection_max; ++i) {
    wire::ReserveBlocksReply r;
    ASSERT_EQ(reserve(a, {chain_hash(7, i)}, 0, r), Status::Ok) << i;
    ids.push_back(r.reservation_id);
  }
  wire::ReserveBlocksReply r;
  EXPECT_EQ(reserve(a, {chain_hash(8, 0)}, 0, r), Status::LimitExceeded);
  wire::ReserveSnapshotReply s;
  EXPECT_EQ(reserve_snapshot(a, 0, attention_ns, {1}, s), Status::LimitExceeded);
  ASSERT_EQ(park_->abort(a, {ids.back()}), Status::Ok);
  EXPECT_EQ(park_->abort(a, {ids.back()}), Status::NotFound);
  EXPECT_EQ(reserve(a, {chain_hash(8, 0)}, 0, r), Status::Ok);
}

// Unsealed bytes at a connection's quota and past it, then a uid's across two
// connections: the refusal costs nothing parked, and a seal or an abort gives the
// quota back.
TEST_F(ParkTest, UnsealedBytesAtTheConnectionAndUidQuotasAndPast) {
  make(16, 0, 8, /*connection=*/4 * block_extent, /*uid=*/6 * block_extent);
  const ConnectionId a = connect(attention_ns, block_tokens, false, /*uid=*/7);
  const ConnectionId b = connect(attention_ns, block_tokens, false, /*uid=*/7);
  const ConnectionId other = connect(attention_ns, block_tokens, false, /*uid=*/8);
  wire::ReserveBlocksReply r1, r2, r3;
  ASSERT_EQ(reserve(a, chain(1, 4), 0, r1), Status::Ok);  // a: at its quota
  EXPECT_EQ(reserve(a, chain(2, 1), 0, r2), Status::LimitExceeded);
  ASSERT_EQ(reserve(b, chain(3, 2), 0, r2), Status::Ok);  // uid 7: at its quota
  EXPECT_EQ(reserve(b, chain(4, 1), 0, r3), Status::LimitExceeded);
  ASSERT_EQ(reserve(other, chain(5, 4), 0, r3), Status::Ok);  // another uid: its own
  EXPECT_EQ(park_->counters().unsealed_quota_refusals, 2u);
  ASSERT_EQ(park_->seal(a, sealing(r1)), Status::Ok);  // sealed: no longer unsealed
  EXPECT_EQ(reserve(b, chain(4, 1), 0, r1), Status::Ok);
  ASSERT_EQ(park_->abort(b, {r2.reservation_id}), Status::Ok);
  EXPECT_EQ(reserve(a, chain(6, 2), 0, r2), Status::Ok);
}

// A reservation left unsealed past the deadline is aborted at the next tick: its
// extents are free again, the quota given back, and sealing it later is NotFound.
TEST_F(ParkTest, AReservationUnsealedPastTheDeadlineIsAborted) {
  make(16, 0, 8, /*connection=*/4 * block_extent, 0);
  const ConnectionId a = connect();
  wire::ReserveBlocksReply r;
  ASSERT_EQ(reserve(a, chain(1, 4), 0, r), Status::Ok);
  const uint64_t free_reserved = park_->stats().arena_free_bytes;
  park_->tick_at(monotonic_usec() + limits::unsealed_deadline_usec / 2);
  EXPECT_EQ(park_->counters().reservations_expired, 0u);
  park_->tick_at(monotonic_usec() + limits::unsealed_deadline_usec + 1);
  EXPECT_EQ(park_->counters().reservations_expired, 1u);
  EXPECT_EQ(park_->stats().arena_free_bytes, free_reserved + 4 * block_extent);
  EXPECT_EQ(park_->seal(a, sealing(r)), Status::NotFound);
  wire::ReserveBlocksReply again;
  EXPECT_EQ(reserve(a, chain(1, 4), 0, again), Status::Ok);
}

TEST_F(ParkTest, ReservationBytesAtCapAndOneGranuleMore) {
  make(16, /*reservation_bytes_max=*/4 * block_extent);
  const ConnectionId a = connect();
  wire::ReserveBlocksReply r;
  ASSERT_EQ(reserve(a, chain(1, 4), 0, r), Status::Ok);
  ASSERT_EQ(park_->abort(a, {r.reservation_id}), Status::Ok);
  EXPECT_EQ(reserve(a, chain(1, 5), 0, r), Status::LimitExceeded);
  // Present blocks cost nothing: 4 new + 1 parked is within the cap.
  publish(a, {chain_hash(1, 0)});
  EXPECT_EQ(reserve(a, chain(1, 5), 0, r), Status::Ok);
  ASSERT_EQ(park_->abort(a, {r.reservation_id}), Status::Ok);
  // Snapshots: an extent of exactly the cap, then one block_extent more.
  const uint64_t offset = shm::payload_offset_for(3);
  wire::ReserveSnapshotReply s;
  ASSERT_EQ(reserve_snapshot(a, 0, attention_ns, {1, 2, 3}, s, 4 * block_extent - offset),
            Status::Ok);
  EXPECT_EQ(s.extent_bytes, 4 * block_extent);
  ASSERT_EQ(park_->abort(a, {s.reservation_id}), Status::Ok);
  EXPECT_EQ(reserve_snapshot(a, 0, attention_ns, {1, 2, 3}, s, 4 * block_extent - offset + 1),
            Status::LimitExceeded);
  EXPECT_EQ(table_->bytes_free(), 15 * block_extent);
}

TEST_F(ParkTest, LookupTokensAtCapAndCapPlusOne) {
  make(16);
  constexpr uint32_t big_block = limits::block_tokens_max;
  const ConnectionId a = connect({0xb16, 0}, big_block);
  const size_t chunks = limits::lookup_tokens_max / big_block;
  wire::LookupReply reply;
  EXPECT_EQ(lookup(a, chain(1, chunks), {}, reply, big_block), Status::Ok);
  EXPECT_EQ(lookup(a, chain(1, chunks), {1}, reply, big_block), Status::LimitExceeded);
}

TEST_F(ParkTest, LookupRejectsInconsistentPromptLength) {
  const ConnectionId a = connect();
  wire::LookupRequest req;
  req.chunk_hashes = chain(1, 2);
  req.tail_tokens = {1};
  req.prompt_tokens = 2 * block_tokens;  // says 32, carries 33
  wire::LookupReply reply;
  EXPECT_EQ(park_->lookup(a, req, reply), Status::InvalidArgument);
  req.prompt_tokens = 0;
  req.chunk_hashes.clear();
  req.tail_tokens.clear();
  EXPECT_EQ(park_->lookup(a, req, reply), Status::InvalidArgument);
  req.tail_tokens.assign(block_tokens, 1);  // a whole chunk sent as tail
  req.prompt_tokens = block_tokens;
  EXPECT_EQ(park_->lookup(a, req, reply), Status::InvalidArgument);
}

}  // namespace
}  // namespace kvpark::daemon
