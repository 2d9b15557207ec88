// A hostile or buggy engine on the same machine, with only what an attached client
// is handed: the socket and, from HELLO, the arena's header and data fds. It runs in
// a process of its own (fork) against a real kvparkd. Whatever it does, the daemon
// stays up, others keep attaching, and no altered byte is ever handed to another
// engine: altered entries restore as misses and are counted (corrupt_payloads).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <vector>

#include "shm/arena_format.h"
#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_client.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

constexpr uint64_t victim_ns = 0x7151;
constexpr uint64_t hostile_ns = 99;
constexpr uint32_t block_tokens = 64;
constexpr uint64_t block_bytes = 16 * 1024;
constexpr size_t victim_blocks = 16;

// Runs `attack` in a child process; its exit code (or 128 + signal).
int in_child(const std::function<int()>& attack) {
  const pid_t pid = fork();
  if (pid == 0) _exit(attack());
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct HostileAttachment {
  RawClient client;
  int header_fd = -1;
  int data_fd = -1;
  uint64_t data_bytes = 0;
  bool ok = false;
};

HostileAttachment attach_hostile(const std::string& socket) {
  HostileAttachment a;
  if (!a.client.connect(socket)) return a;
  wire::HelloReply reply;
  const Status s = a.client.hello_with_arena({hostile_ns, 0}, {block_tokens, 4096, false},
                                             a.header_fd, a.data_fd, &reply);
  a.data_bytes = reply.data_bytes;
  a.ok = s == Status::Ok && a.header_fd >= 0 && a.data_fd >= 0;
  return a;
}

// Applies `alter` to the payload of every sealed entry of another namespace,
// found the way a hostile client would: by scanning the arena for entry headers.
// Returns how many payloads it altered.
size_t alter_foreign_payloads(uint8_t* data, uint64_t data_bytes, size_t skip_first,
                              const std::function<void(uint8_t*, uint64_t)>& alter) {
  size_t seen = 0, altered = 0;
  for (uint64_t off = 0; off + sizeof(shm::EntryHeader) <= data_bytes; off += limits::extent_align_bytes) {
    shm::EntryHeader h;
    std::memcpy(&h, data + off, sizeof h);
    if (h.magic != shm::entry_magic || h.namespace_id.low == hostile_ns) continue;
    if (h.payload_offset == 0 || off + h.payload_offset + h.payload_bytes > data_bytes) continue;
    if (seen++ < skip_first) continue;
    alter(data + off + h.payload_offset, h.payload_bytes);
    ++altered;
  }
  return altered;
}

class HostileClient : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.start());
    victim_ = connect_client(daemon_.socket_path(), engine_namespace(victim_ns, block_tokens, block_bytes));
    ASSERT_NE(victim_, nullptr);
    tokens_ = engine_prompt(42, victim_blocks * block_tokens + 5);
    ASSERT_EQ(park_blocks_fused(victim_.get(), tokens_), KVPARK_OK);
  }

  // Parks every block through the fused copy-and-checksum path.
  kvpark_status park_blocks_fused(kvpark_client* c, const std::vector<int32_t>& tokens) {
    const auto hashes = block_hashes(victim_ns, tokens, block_tokens);
    kvpark_publish_options options{1, KVPARK_CLASS_SHARED, KVPARK_EVIDENCE_ENGINE_STRUCTURAL};
    kvpark_reservation* r = nullptr;
    kvpark_status s = kvpark_reserve_blocks(c, &options, tokens.data(), tokens.size(), 0, hashes.size(), &r);
    if (s != KVPARK_OK) return s;
    std::vector<uint8_t> payload(block_bytes);
    for (size_t i = 0; i < hashes.size(); ++i) {
      if (kvpark_reservation_block(r, i) == nullptr) continue;
      fill_payload(payload_key(hashes[i]), payload.data(), block_bytes);
      if (kvpark_status w = kvpark_reservation_write_block(r, i, payload.data()); w != KVPARK_OK) {
        kvpark_abort(r);
        return w;
      }
    }
    return kvpark_seal(r);
  }

  // Restores the victim's prompt through the verifying copy. Returns the blocks
  // copied intact; fails the test if any byte handed over is wrong.
  size_t restore_verified(kvpark_client* c, kvpark_status* ret_first_failure = nullptr) {
    kvpark_plan* plan = nullptr;
    EXPECT_EQ(kvpark_lookup(c, 2, tokens_.data(), tokens_.size(), &plan), KVPARK_OK);
    if (plan == nullptr) return 0;
    const auto hashes = block_hashes(victim_ns, tokens_, block_tokens);
    std::vector<uint8_t> out(block_bytes);
    size_t good = 0;
    kvpark_status failure = KVPARK_OK;
    for (size_t i = 0; i < kvpark_plan_block_count(plan); ++i) {
      const kvpark_status s = kvpark_plan_copy_block(plan, i, out.data());
      if (s != KVPARK_OK) {
        failure = s;
        break;
      }
      EXPECT_TRUE(payload_matches(payload_key(hashes[i]), out.data(), block_bytes))
          << "block " << i << " was handed over with wrong bytes";
      ++good;
    }
    if (failure != KVPARK_OK) {
      EXPECT_EQ(kvpark_plan_restorable_tokens(plan), good * block_tokens) << "the plan shrinks to what is good";
      EXPECT_EQ(kvpark_plan_block_count(plan), good);
    }
    if (ret_first_failure != nullptr) *ret_first_failure = failure;
    kvpark_plan_release(plan);
    return good;
  }

  uint64_t corrupt_payloads() {
    kvpark_stats st{};
    EXPECT_EQ(kvpark_get_stats(victim_.get(), &st), KVPARK_OK);
    return st.corrupt_payloads;
  }

  // The daemon is up and a newcomer can attach and restore everything intact.
  void expect_service_intact(size_t blocks_expected) {
    ASSERT_TRUE(daemon_.running());
    ClientPtr newcomer = connect_client(daemon_.socket_path(), engine_namespace(victim_ns, block_tokens, block_bytes));
    ASSERT_NE(newcomer, nullptr) << "a later client could not attach";
    EXPECT_EQ(restore_verified(newcomer.get()), blocks_expected);
  }

  DaemonProcess daemon_{{.arena_bytes = 32ull << 20}};
  ClientPtr victim_;
  std::vector<int32_t> tokens_;
};

TEST_F(HostileClient, ResizingOrResealingTheArenaIsRefused) {
  const int refused = in_child([&] {
    HostileAttachment a = attach_hostile(daemon_.socket_path());
    if (!a.ok) return 100;
    int succeeded = 0;
    if (ftruncate(a.data_fd, 4096) == 0) succeeded |= 1;
    if (ftruncate(a.data_fd, static_cast<off_t>(a.data_bytes) * 2) == 0) succeeded |= 2;
    if (fallocate(a.data_fd, 0, static_cast<off_t>(a.data_bytes), 1 << 20) == 0) succeeded |= 4;
    if (ftruncate(a.header_fd, 0) == 0) succeeded |= 8;
    if (fcntl(a.data_fd, F_ADD_SEALS, F_SEAL_WRITE) == 0) succeeded |= 16;
    if (fcntl(a.data_fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0) succeeded |= 32;
    return succeeded;
  });
  EXPECT_EQ(refused, 0) << "bitmask of resizes and seals the kernel allowed";
  // RESERVE after the attempts: before the seals, this is where the daemon took SIGBUS.
  const auto more = engine_prompt(43, 8 * block_tokens + 1);
  EXPECT_EQ(park_blocks_fused(victim_.get(), more), KVPARK_OK);
  expect_service_intact(victim_blocks);
}

TEST_F(HostileClient, HeaderCannotBeWrittenSoOthersStillAttach) {
  const int wrote = in_child([&] {
    HostileAttachment a = attach_hostile(daemon_.socket_path());
    if (!a.ok) return 100;
    int succeeded = 0;
    const uint8_t zeros[64] = {};
    if (pwrite(a.header_fd, zeros, sizeof zeros, 0) >= 0) succeeded |= 1;
    if (mmap(nullptr, limits::arena_header_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.header_fd, 0) !=
        MAP_FAILED) {
      succeeded |= 2;
    }
    void* ro = mmap(nullptr, limits::arena_header_bytes, PROT_READ, MAP_SHARED, a.header_fd, 0);
    if (ro != MAP_FAILED && mprotect(ro, limits::arena_header_bytes, PROT_READ | PROT_WRITE) == 0) {
      succeeded |= 4;
    }
    // Reopened through /proc as a writable file: still sealed.
    const std::string path = "/proc/self/fd/" + std::to_string(a.header_fd);
    const int reopened = open(path.c_str(), O_RDWR);
    if (reopened >= 0 && pwrite(reopened, zeros, sizeof zeros, 0) >= 0) succeeded |= 8;
    return succeeded;
  });
  EXPECT_EQ(wrote, 0) << "bitmask of header writes the kernel allowed";
  expect_service_intact(victim_blocks);
}

TEST_F(HostileClient, AlteredSealedPayloadsRestoreAsMissesAndAreCounted) {
  const uint64_t before = corrupt_payloads();
  // Keep the first 6 blocks intact, XOR the payloads of the rest.
  const int altered = in_child([&] {
    HostileAttachment a = attach_hostile(daemon_.socket_path());
    if (!a.ok) return 255;
    void* m = mmap(nullptr, a.data_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.data_fd, 0);
    if (m == MAP_FAILED) return 254;
    return static_cast<int>(alter_foreign_payloads(static_cast<uint8_t*>(m), a.data_bytes, 6,
                                                   [](uint8_t* p, uint64_t n) {
                                                     for (uint64_t i = 0; i < n; i += 997) p[i] ^= 0x5a;
                                                   }));
  });
  ASSERT_EQ(altered, static_cast<int>(victim_blocks - 6));
  kvpark_status failure = KVPARK_OK;
  EXPECT_EQ(restore_verified(victim_.get(), &failure), 6u) << "the intact prefix still restores";
  EXPECT_EQ(failure, KVPARK_CORRUPT);
  // The daemon heard of it: the entry is dropped and counted, so later lookups stop there.
  ASSERT_TRUE(wait_until([&] { return corrupt_payloads() > before; }, 5'000)) << "corrupt_payloads never rose";
  expect_service_intact(6);
  // The pointer accessor checks too: a block altered in place comes back NULL.
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(victim_.get(), 3, tokens_.data(), tokens_.size(), &plan), KVPARK_OK);
  EXPECT_EQ(kvpark_plan_block_count(plan), 6u);
  kvpark_plan_release(plan);
  // Parking the altered blocks again makes them whole.
  ASSERT_EQ(park_blocks_fused(victim_.get(), tokens_), KVPARK_OK);
  expect_service_intact(victim_blocks);
}

// An engine of the same namespace that says intact payloads are altered (a bug, or on
// purpose): the daemon checks before it drops anything, keeps the entries, and acts
// on none of that connection's reports again. Every block still restores.
TEST_F(HostileClient, ReportingIntactPayloadsCorruptDropsNothing) {
  const uint64_t before = corrupt_payloads();
  const int reported = in_child([&] {
    RawClient liar(daemon_.socket_path());
    if (liar.hello({victim_ns, 0}, {block_tokens, block_bytes, false}) != Status::Ok) return 255;
    wire::LookupRequest lookup;
    lookup.session_id = 9;
    lookup.prompt_tokens = static_cast<uint32_t>(tokens_.size());
    for (const kvpark_hash128& h : block_hashes(victim_ns, tokens_, block_tokens))
      lookup.chunk_hashes.push_back({h.low, h.high});
    lookup.tail_tokens.assign(tokens_.begin() + ptrdiff_t(victim_blocks * block_tokens),
                              tokens_.end());
    std::vector<uint8_t> frame;
    wire::encode(lookup, 2, frame);
    wire::FrameHeader header;
    std::vector<uint8_t> body;
    wire::LookupReply reply;
    if (!liar.call(frame, header, body) || header.status != 0 ||
        wire::decode(body, reply) != Status::Ok)
      return 254;
    for (uint64_t offset : reply.block_offsets) {
      frame.clear();
      wire::encode(wire::CorruptReport{.lease_id = reply.lease_id, .extent_offset = offset}, 3,
                   frame);
      if (!liar.send(frame)) return 253;
    }
    // A round trip after the reports: the daemon has handled them (one connection, in order).
    frame.clear();
    wire::encode(wire::ReleaseRequest{.lease_id = reply.lease_id}, 4, frame);
    if (!liar.call(frame, header, body)) return 252;
    return static_cast<int>(reply.block_offsets.size());
  });
  ASSERT_EQ(reported, static_cast<int>(victim_blocks));
  EXPECT_EQ(corrupt_payloads(), before) << "an intact payload was counted as altered";
  expect_service_intact(victim_blocks);
  const std::string log = daemon_.log_tail();
  EXPECT_NE(log.find("but it matches its checksum"), std::string::npos) << log;
}

TEST_F(HostileClient, RawPointerAccessRefusesAlteredPayloads) {
  const int altered = in_child([&] {
    HostileAttachment a = attach_hostile(daemon_.socket_path());
    if (!a.ok) return 255;
    void* m = mmap(nullptr, a.data_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.data_fd, 0);
    if (m == MAP_FAILED) return 254;
    return static_cast<int>(alter_foreign_payloads(static_cast<uint8_t*>(m), a.data_bytes, 3,
                                                   [](uint8_t* p, uint64_t) { p[100] ^= 1; }));
  });
  ASSERT_GT(altered, 0);
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(victim_.get(), 3, tokens_.data(), tokens_.size(), &plan), KVPARK_OK);
  const auto hashes = block_hashes(victim_ns, tokens_, block_tokens);
  size_t served = 0;
  for (size_t i = 0; i < victim_blocks; ++i) {
    const void* p = kvpark_plan_block(plan, i);
    if (p == nullptr) break;
    EXPECT_TRUE(payload_matches(payload_key(hashes[i]), p, block_bytes)) << "block " << i;
    ++served;
  }
  EXPECT_EQ(served, 3u);
  EXPECT_EQ(kvpark_plan_restorable_tokens(plan), 3 * block_tokens);
  kvpark_plan_release(plan);
}

// kvpark_plan_read_block(): the same check for a reader that copies every block out
// in parts, interleaved across blocks (kvpark-proxy writing a slot file layer by
// layer): each block in order on its own, and the part that ends a block says whether
// any of that block may be used.
TEST_F(HostileClient, BlocksReadInInterleavedPartsFailAtTheirLastPart) {
  constexpr size_t intact = 3;
  const int altered = in_child([&] {
    HostileAttachment a = attach_hostile(daemon_.socket_path());
    if (!a.ok) return 255;
    void* m = mmap(nullptr, a.data_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.data_fd, 0);
    if (m == MAP_FAILED) return 254;
    return static_cast<int>(alter_foreign_payloads(static_cast<uint8_t*>(m), a.data_bytes, intact,
                                                   [](uint8_t* p, uint64_t) { p[100] ^= 1; }));
  });
  ASSERT_EQ(altered, static_cast<int>(victim_blocks - intact));
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(victim_.get(), 3, tokens_.data(), tokens_.size(), &plan), KVPARK_OK);
  ASSERT_EQ(kvpark_plan_block_count(plan), victim_blocks) << "nothing is checked at lookup";
  std::vector<std::vector<uint8_t>> out(victim_blocks, std::vector<uint8_t>(block_bytes));
  EXPECT_EQ(kvpark_plan_read_block(plan, 0, 8, out[0].data(), 8), KVPARK_INVALID_ARGUMENT)
      << "a block's parts come in order from 0";
  const uint64_t part = block_bytes / 3 + 1;  // parts that end off every stripe
  std::vector<kvpark_status> last(victim_blocks, KVPARK_OK);
  for (uint64_t at = 0; at < block_bytes; at += part) {
    const uint64_t n = std::min<uint64_t>(part, block_bytes - at);
    for (size_t i = 0; i < victim_blocks && i < kvpark_plan_block_count(plan); ++i)
      last[i] = kvpark_plan_read_block(plan, i, at, out[i].data() + at, n);
  }
  const auto hashes = block_hashes(victim_ns, tokens_, block_tokens);
  for (size_t i = 0; i < intact; ++i) {
    EXPECT_EQ(last[i], KVPARK_OK) << "block " << i;
    EXPECT_TRUE(payload_matches(payload_key(hashes[i]), out[i].data(), block_bytes)) << i;
  }
  EXPECT_EQ(last[intact], KVPARK_CORRUPT);
  EXPECT_EQ(kvpark_plan_block_count(plan), intact) << "the plan ends before the altered block";
  EXPECT_EQ(kvpark_plan_restorable_tokens(plan), intact * block_tokens);
  EXPECT_EQ(kvpark_plan_read_block(plan, intact, 0, out[0].data(), 1), KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(kvpark_plan_read_block(plan, 0, block_bytes, out[0].data(), 1), KVPARK_INVALID_ARGUMENT)
      << "past the end";
  kvpark_plan_release(plan);
}

TEST_F(HostileClient, PunchedHolesRestoreAsMissesAndTheDaemonKeepsServing) {
  const int punched = in_child([&] {
    HostileAttachment a = attach_hostile(daemon_.socket_path());
    if (!a.ok) return 255;
    // Punching needs no mapping: every extent of another namespace, from its header.
    void* m = mmap(nullptr, a.data_bytes, PROT_READ, MAP_SHARED, a.data_fd, 0);
    if (m == MAP_FAILED) return 254;
    auto* data = static_cast<uint8_t*>(m);
    return static_cast<int>(alter_foreign_payloads(data, a.data_bytes, 0, [&](uint8_t* p, uint64_t n) {
      (void)fallocate(a.data_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, p - data, static_cast<off_t>(n));
    }));
  });
  ASSERT_EQ(punched, static_cast<int>(victim_blocks));
  kvpark_status failure = KVPARK_OK;
  EXPECT_EQ(restore_verified(victim_.get(), &failure), 0u);
  EXPECT_EQ(failure, KVPARK_CORRUPT);
  // The daemon writes into the punched pages again (no SIGBUS: the size never changed).
  ASSERT_TRUE(wait_until([&] { return corrupt_payloads() > 0; }, 5'000));
  ASSERT_EQ(park_blocks_fused(victim_.get(), tokens_), KVPARK_OK);
  expect_service_intact(victim_blocks);
}

// On a hugetlb arena a punched hole is refilled from the reserved pool, and a
// client can empty the pool first (a writable mapping past the end of the memfd
// grows it). The daemon's next write into the hole would be SIGBUS: it must fail
// that reservation and live. (Only where huge pages back the arena.)
TEST_F(HostileClient, PunchingHugePagesAndEmptyingThePoolCannotKillTheDaemon) {
  kvpark_stats st{};
  ASSERT_EQ(kvpark_get_stats(victim_.get(), &st), KVPARK_OK);
  if (st.arena_pages != 2) GTEST_SKIP() << "the arena is not on hugetlb pages (vm.nr_hugepages reserves them)";
  const int drained = in_child([&] {
    HostileAttachment a = attach_hostile(daemon_.socket_path());
    if (!a.ok) return 255;
    if (fallocate(a.data_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(a.data_bytes)) != 0)
      return 254;
    // Take every free huge page: touch pages past the end until the pool is empty
    // (a touch that finds none is SIGBUS, in a grandchild of its own).
    const uint64_t page = 2ull << 20, extra = 4096 * page;
    void* m = mmap(nullptr, a.data_bytes + extra, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a.data_fd, 0);
    if (m == MAP_FAILED) return 253;
    const pid_t toucher = fork();
    if (toucher == 0) {
      signal(SIGBUS, SIG_DFL);  // the kernel's verdict, not a sanitizer's report of it
      for (uint64_t off = a.data_bytes; off < a.data_bytes + extra; off += page) static_cast<volatile uint8_t*>(m)[off] = 1;
      _exit(0);
    }
    int status = 0;
    waitpid(toucher, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS ? 0 : 252;
  });
  ASSERT_EQ(drained, 0) << "the pool was not emptied";
  // The victim parks a new prompt: the daemon writes its entry headers into free
  // extents, all punched.
  EXPECT_NE(park_blocks_fused(victim_.get(), engine_prompt(43, victim_blocks * block_tokens + 5)), KVPARK_OK);
  ASSERT_TRUE(daemon_.running());
  EXPECT_EQ(kvpark_get_stats(victim_.get(), &st), KVPARK_OK) << "the daemon stopped answering";
  ClientPtr newcomer = connect_client(daemon_.socket_path(), engine_namespace(victim_ns, block_tokens, block_bytes));
  EXPECT_NE(newcomer, nullptr) << "a later client could not attach";
  std::ifstream log(daemon_.log_path());
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("is gone"), std::string::npos) << text;
}

TEST_F(HostileClient, MappingPastTheEndFaultsOnlyThatClient) {
  const int result = in_child([&] {
    HostileAttachment a = attach_hostile(daemon_.socket_path());
    if (!a.ok) return 100;
    const uint64_t beyond = a.data_bytes + (2ull << 20);
    void* m = mmap(nullptr, beyond, PROT_READ | PROT_WRITE, MAP_SHARED, a.data_fd, 0);
    if (m == MAP_FAILED) return 101;  // refused outright: also fine
    // Touch past the end in a grandchild: the fault is that process's own.
    const pid_t toucher = fork();
    if (toucher == 0) {
      signal(SIGBUS, SIG_DFL);  // the kernel's verdict, not a sanitizer's report of it
      static_cast<volatile uint8_t*>(m)[a.data_bytes + 4096] = 1;
      _exit(0);
    }
    int status = 0;
    waitpid(toucher, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) return 102;
    // hugetlbfs extends a file to the end of a writable shared mapping, seals or
    // not: the touch then lands on a page of its own, past everything the daemon
    // and other clients map.
    struct stat st {};
    return WIFEXITED(status) && fstat(a.data_fd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= beyond ? 104
                                                                                                           : 103;
  });
  kvpark_stats st{};
  ASSERT_EQ(kvpark_get_stats(victim_.get(), &st), KVPARK_OK);
  if (st.arena_pages == 2) {
    EXPECT_TRUE(result == 101 || result == 102 || result == 104) << "result " << result;
  } else {
    EXPECT_TRUE(result == 101 || result == 102) << "result " << result;
  }
  expect_service_intact(victim_blocks);
}

TEST_F(HostileClient, ScribblingOverEverythingWritableLosesOnlyPayloads) {
  const int done = in_child([&] {
    HostileAttachment a = attach_hostile(daemon_.socket_path());
    if (!a.ok) return 100;
    void* m = mmap(nullptr, a.data_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.data_fd, 0);
    if (m == MAP_FAILED) return 101;
    std::memset(m, 0xa5, a.data_bytes);  // headers, tokens and payloads alike
    return 0;
  });
  ASSERT_EQ(done, 0);
  // Entry headers and token ids are gone: nothing confirms, nothing wrong is served.
  EXPECT_EQ(restore_verified(victim_.get()), 0u);
  // The arena header is untouched: newcomers attach, and parking again works.
  ASSERT_EQ(park_blocks_fused(victim_.get(), tokens_), KVPARK_OK);
  expect_service_intact(victim_blocks);
}

constexpr uint64_t snapshot_test_bytes = 3 * 1024 * 1024 + 17;

// Parks `state` as a snapshot at position 200 of `tokens`, written in two ordered
// pieces (checksummed while copying).
void park_snapshot(kvpark_client* c, const std::vector<int32_t>& tokens,
                   const std::vector<uint8_t>& state) {
  kvpark_publish_options options{1, KVPARK_CLASS_SHARED, KVPARK_EVIDENCE_ENGINE_STRUCTURAL};
  kvpark_reservation* r = nullptr;
  ASSERT_EQ(kvpark_reserve_snapshot(c, &options, tokens.data(), 200, state.size(), &r), KVPARK_OK);
  ASSERT_EQ(kvpark_reservation_write_snapshot(r, 0, state.data(), 1 << 20), KVPARK_OK);
  ASSERT_EQ(kvpark_reservation_write_snapshot(r, 1 << 20, state.data() + (1 << 20), state.size() - (1 << 20)),
            KVPARK_OK);
  ASSERT_EQ(kvpark_seal(r), KVPARK_OK);
}

// Another member of the group flips the last byte of the one payload in the arena.
void flip_the_parked_snapshot(const DaemonProcess& daemon) {
  const int flipped = in_child([&] {
    RawClient raw(daemon.socket_path());
    int hfd = -1, dfd = -1;
    wire::HelloReply reply;
    if (raw.hello_with_arena({hostile_ns, 0}, {block_tokens, 4096, false}, hfd, dfd, &reply) != Status::Ok) return 255;
    void* m = mmap(nullptr, reply.data_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, dfd, 0);
    if (m == MAP_FAILED) return 254;
    return static_cast<int>(alter_foreign_payloads(static_cast<uint8_t*>(m), reply.data_bytes, 0,
                                                   [](uint8_t* p, uint64_t n) { p[n - 1] ^= 0x80; }));
  });
  ASSERT_EQ(flipped, 1);
}

// A daemon with one snapshot (`state`) parked by client `c`, at position 200 of `tokens`.
class SnapshotVerification : public ::testing::Test {
 protected:
  void park(uint64_t namespace_id, uint32_t prompt_seed, uint64_t payload_seed) {
    ASSERT_TRUE(daemon.start());
    c = connect_client(daemon.socket_path(), engine_namespace(namespace_id, 0, 0));
    ASSERT_NE(c, nullptr);
    tokens = engine_prompt(prompt_seed, 300);
    state.resize(snapshot_test_bytes);
    fill_payload(payload_seed, state.data(), state.size());
    ASSERT_NO_FATAL_FAILURE(park_snapshot(c.get(), tokens, state));
  }

  DaemonProcess daemon{{.arena_bytes = 32ull << 20}};
  ClientPtr c;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> state;
};

// The altered snapshot was reported and dropped: never offered again.
void expect_dropped_and_counted(kvpark_client* c, const std::vector<int32_t>& tokens) {
  kvpark_stats st{};
  ASSERT_TRUE(wait_until([&] { return kvpark_get_stats(c, &st) == KVPARK_OK && st.corrupt_payloads == 1; },
                         5'000));
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(c, 4, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  EXPECT_EQ(kvpark_plan_restorable_tokens(plan), 0u) << "a dropped entry is never offered again";
  kvpark_plan_release(plan);
}

TEST_F(SnapshotVerification, AlteredSnapshotIsAMissAndNeverHandedOver) {
  ASSERT_NO_FATAL_FAILURE(park(0x5a9, 7, 0xabc));

  std::vector<uint8_t> out(state.size());
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(c.get(), 2, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  ASSERT_EQ(kvpark_plan_restorable_tokens(plan), 200u);
  ASSERT_EQ(kvpark_plan_copy_snapshot(plan, out.data(), out.size()), KVPARK_OK);
  EXPECT_EQ(out, state);
  kvpark_plan_release(plan);

  ASSERT_NO_FATAL_FAILURE(flip_the_parked_snapshot(daemon));
  ASSERT_EQ(kvpark_lookup(c.get(), 3, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  ASSERT_EQ(kvpark_plan_restorable_tokens(plan), 200u) << "header and tail still confirm";
  std::fill(out.begin(), out.end(), 0);
  EXPECT_EQ(kvpark_plan_copy_snapshot(plan, out.data(), out.size()), KVPARK_CORRUPT);
  EXPECT_EQ(kvpark_plan_restorable_tokens(plan), 0u);
  EXPECT_EQ(kvpark_plan_snapshot(plan, nullptr, nullptr), nullptr);
  kvpark_plan_release(plan);
  expect_dropped_and_counted(c.get(), tokens);
}

// kvpark_plan_read_snapshot(): the same check, for a reader that copies the snapshot
// out in parts (kvpark-proxy, into a slot file): in order only, and the part that
// ends the snapshot says whether any of it may be used.
TEST_F(SnapshotVerification, AlteredSnapshotReadInPartsFailsAtItsLastPart) {
  ASSERT_NO_FATAL_FAILURE(park(0x5aa, 8, 0xabd));
  constexpr uint64_t part = 256 * 1024 + 3;  // parts that end off every stripe
  const uint64_t last = (state.size() - 1) / part * part;

  std::vector<uint8_t> out(state.size());
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(c.get(), 2, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  uint32_t position = 0;
  ASSERT_EQ(kvpark_plan_snapshot_bytes(plan, &position), state.size());
  EXPECT_EQ(position, 200u);
  EXPECT_EQ(kvpark_plan_read_snapshot(plan, part, out.data(), part), KVPARK_INVALID_ARGUMENT)
      << "parts come in order from 0";
  for (uint64_t at = 0; at < state.size(); at += part) {
    const uint64_t n = std::min(part, state.size() - at);
    ASSERT_EQ(kvpark_plan_read_snapshot(plan, at, out.data() + at, n), KVPARK_OK) << at;
    if (at == part) {
      EXPECT_EQ(kvpark_plan_read_snapshot(plan, 0, out.data(), 0), KVPARK_OK);  // starts over
      EXPECT_EQ(kvpark_plan_read_snapshot(plan, at + n, out.data(), 1), KVPARK_INVALID_ARGUMENT)
          << "after starting over, only offset 0 follows";
      ASSERT_EQ(kvpark_plan_read_snapshot(plan, 0, out.data(), at + n), KVPARK_OK);
    }
  }
  EXPECT_EQ(out, state);
  EXPECT_EQ(kvpark_plan_read_snapshot(plan, state.size(), out.data(), 1), KVPARK_INVALID_ARGUMENT)
      << "past the end";
  kvpark_plan_release(plan);

  ASSERT_NO_FATAL_FAILURE(flip_the_parked_snapshot(daemon));
  ASSERT_EQ(kvpark_lookup(c.get(), 3, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  ASSERT_EQ(kvpark_plan_snapshot_bytes(plan, nullptr), state.size()) << "header and tail still confirm";
  for (uint64_t at = 0; at < last; at += part) {
    ASSERT_EQ(kvpark_plan_read_snapshot(plan, at, out.data() + at, part), KVPARK_OK) << at;
  }
  EXPECT_EQ(kvpark_plan_read_snapshot(plan, last, out.data() + last, state.size() - last), KVPARK_CORRUPT);
  EXPECT_EQ(kvpark_plan_restorable_tokens(plan), 0u);
  EXPECT_EQ(kvpark_plan_snapshot_bytes(plan, &position), 0u);
  EXPECT_EQ(position, 0u);
  kvpark_plan_release(plan);
  expect_dropped_and_counted(c.get(), tokens);
}

}  // namespace
}  // namespace kvpark::testing
