// Helpers for the disk-tier tests: a scratch directory on a real file system, aligned
// images with deterministic bytes, record metadata, and waiting for completions.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "iouring/disk_store.h"
#include "iouring/fault_engine.h"
#include "iouring/uring_engine.h"

namespace kvpark::disk::testing {

// O_DIRECT needs a block-backed file system; /var/tmp is one on every machine we run on.
inline std::string make_scratch_dir() {
  const char* base = std::getenv("KVPARK_DISK_TEST_DIR");
  std::string tmpl = std::string(base ? base : "/var/tmp") + "/kvpark-disk-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return {};
  return buf.data();
}

struct AlignedImage {
  explicit AlignedImage(uint64_t n, uint64_t seed = 0, uint64_t misalign = 0) : bytes(n) {
    storage = static_cast<uint8_t*>(std::aligned_alloc(4096, align_io(n + misalign + 4096)));
    data = storage + misalign;
    fill(seed);
  }
  ~AlignedImage() { std::free(storage); }
  void fill(uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t i = 0; i < bytes; ++i) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      data[i] = static_cast<uint8_t>(x);
    }
  }
  uint8_t* storage;
  uint8_t* data;
  uint64_t bytes;
};

inline RecordHeader make_meta(uint64_t key, uint64_t image_bytes) {
  RecordHeader h{};
  h.kind = static_cast<uint8_t>(EntryKind::Block);
  h.entry_class = static_cast<uint8_t>(EntryClass::Shared);
  h.evidence = static_cast<uint8_t>(Evidence::DefaultAutomatic);
  h.block_tokens = 64;
  h.namespace_id = Hash128{0x1234, 0x5678};
  h.block_payload_bytes = image_bytes;
  h.chain_tokens = 64;
  h.token_count = 64;
  h.key_hash = Hash128{key * 7919 + 1, key};
  h.position = 64;
  h.payload_bytes = image_bytes / 2;
  h.image_bytes = image_bytes;
  h.creator_session = 42;
  h.created_unix_usec = 1700000000000000ull;
  return h;
}

// Collects completions until `count` arrived or the timeout passed.
inline std::vector<DiskCompletion> wait_completions(DiskStore& store, size_t count, int timeout_ms = 30000) {
  std::vector<DiskCompletion> out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (out.size() < count && std::chrono::steady_clock::now() < deadline) {
    pollfd p{store.notify_fd(), POLLIN, 0};
    poll(&p, 1, 100);
    store.take_completions(out);
  }
  return out;
}

inline size_t count_files_with_suffix(const std::string& dir, const std::string& suffix) {
  size_t n = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      ++n;
  }
  return n;
}

// Fixture: a scratch directory removed afterwards; skips when O_DIRECT is unsupported there.
class DiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_scratch_dir();
    ASSERT_FALSE(dir_.empty()) << "mkdtemp under /var/tmp failed";
    store_dir_ = dir_ + "/store";
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Opens store_ on store_dir_; GTEST_SKIPs (via return false) when O_DIRECT is unsupported.
  bool open_store(std::unique_ptr<IoEngine> engine = nullptr, uint32_t queue_depth = 16, uint32_t spill_share = 1) {
    store_.reset();
    DiskStoreOptions o;
    o.directory = store_dir_;
    o.queue_depth = queue_depth;
    o.chunk_bytes = 1 << 20;
    o.spill_ops_while_restoring = spill_share;
    o.engine = std::move(engine);
    OpenError err;
    Status s = DiskStore::open(std::move(o), store_, report_, &err);
    if (s == Status::InvalidArgument && err.detail.find("O_DIRECT") != std::string::npos) {
      skip_reason_ = err.detail;
      return false;
    }
    EXPECT_EQ(s, Status::Ok) << err.detail;
    return s == Status::Ok;
  }
  std::unique_ptr<IoEngine> fault_engine(FaultInjectingEngine** ret_raw, uint32_t depth = 16, uint64_t seed = 1) {
    std::unique_ptr<UringEngine> uring;
    std::string why;
    EXPECT_EQ(UringEngine::create(depth, uring, why), Status::Ok) << why;
    auto f = std::make_unique<FaultInjectingEngine>(std::move(uring), seed);
    *ret_raw = f.get();
    return f;
  }
  // Spills and waits; returns the completion.
  DiskCompletion spill_sync(const RecordHeader& meta, const uint8_t* image) {
    store_->spill(meta, image);
    auto c = wait_completions(*store_, 1);
    EXPECT_EQ(c.size(), 1u);
    return c.empty() ? DiskCompletion{0, DiskCompletion::Kind::Spill, {}, Status::Unavailable} : c[0];
  }
  DiskCompletion restore_sync(RecordId id, uint8_t* dest, uint64_t bytes) {
    store_->restore(id, dest, bytes);
    auto c = wait_completions(*store_, 1);
    EXPECT_EQ(c.size(), 1u);
    return c.empty() ? DiskCompletion{0, DiskCompletion::Kind::Restore, {}, Status::Unavailable} : c[0];
  }

  std::string dir_, store_dir_, skip_reason_;
  std::unique_ptr<DiskStore> store_;
  RecoveryReport report_;
};

#define OPEN_OR_SKIP(...)                                            \
  do {                                                               \
    if (!open_store(__VA_ARGS__)) {                                  \
      if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;       \
      FAIL() << "open failed";                                       \
    }                                                                \
  } while (0)

}  // namespace kvpark::disk::testing
