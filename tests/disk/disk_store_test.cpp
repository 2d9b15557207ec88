// DiskStore on real files: round trips, recovery, replacement, priority, open errors.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "tests/disk/disk_testing.h"

using namespace kvpark;
using namespace kvpark::disk;
using namespace kvpark::disk::testing;

namespace {
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}
}  // namespace

TEST_F(DiskTest, SpillRestoreIsBitExactForEverySizeShape) {
  OPEN_OR_SKIP();
  struct Case { uint64_t bytes; uint64_t misalign; };
  const Case cases[] = {
      {4096, 0},                    // small: one page
      {1 << 20, 0},                 // exactly one chunk
      {3 * (1 << 20) + 4096, 0},    // multi-chunk, last chunk partial
      {5 * (1 << 20) + 100, 0},     // not a multiple of 4 KiB: bounce-buffered tail
      {2 * (1 << 20) + 8192, 512},  // caller memory not 4 KiB-aligned: every chunk bounced
      {100, 0},                     // smaller than a page
  };
  uint64_t key = 1;
  for (const Case& c : cases) {
    AlignedImage src(c.bytes, key, c.misalign);
    RecordHeader meta = make_meta(key, c.bytes);
    DiskCompletion sc = spill_sync(meta, src.data);
    ASSERT_EQ(sc.status, Status::Ok) << c.bytes << " err " << sc.err;
    EXPECT_EQ(sc.bytes, record_layout(c.bytes, 1 << 20).file_bytes);
    AlignedImage dst(c.bytes, 999, c.misalign);
    DiskCompletion rc = restore_sync(sc.id, dst.data, c.bytes);
    ASSERT_EQ(rc.status, Status::Ok) << c.bytes;
    EXPECT_EQ(rc.bytes, c.bytes);
    EXPECT_EQ(memcmp(src.data, dst.data, c.bytes), 0) << "image of " << c.bytes << " bytes differs";
    ++key;
  }
  DiskStats s = store_->stats();
  EXPECT_EQ(s.spills_completed, std::size(cases));
  EXPECT_EQ(s.restores_completed, std::size(cases));
  EXPECT_EQ(s.records, std::size(cases));
  EXPECT_EQ(s.checksum_failures, 0u);
  EXPECT_EQ(s.spills_queued + s.restores_queued, 0u);
  EXPECT_EQ(count_files_with_suffix(store_dir_, ".tmp"), 0u);
}

TEST_F(DiskTest, RestoreOfUnknownRecordIsNotFound) {
  OPEN_OR_SKIP();
  AlignedImage dst(4096);
  DiskCompletion c = restore_sync(record_id_for(make_meta(5, 4096)), dst.data, 4096);
  EXPECT_EQ(c.status, Status::NotFound);
}

TEST_F(DiskTest, RestoreWithWrongSizeIsInvalidArgument) {
  OPEN_OR_SKIP();
  AlignedImage src(8192, 1);
  DiskCompletion sc = spill_sync(make_meta(1, 8192), src.data);
  ASSERT_EQ(sc.status, Status::Ok);
  AlignedImage dst(4096);
  EXPECT_EQ(restore_sync(sc.id, dst.data, 4096).status, Status::InvalidArgument);
}

TEST_F(DiskTest, RecoveryIndexesExactlyTheCompletedRecords) {
  OPEN_OR_SKIP();
  std::vector<RecordId> ids;
  uint64_t bytes_on_disk = 0;
  std::vector<std::unique_ptr<AlignedImage>> images;
  for (uint64_t k = 1; k <= 6; ++k) {
    images.push_back(std::make_unique<AlignedImage>(k * 300000, k));
    DiskCompletion c = spill_sync(make_meta(k, k * 300000), images.back()->data);
    ASSERT_EQ(c.status, Status::Ok);
    ids.push_back(c.id);
    bytes_on_disk += c.bytes;
  }
  store_->remove(ids[2]);  // removed: must not come back
  bytes_on_disk -= record_layout(3 * 300000, 1 << 20).file_bytes;
  store_->shutdown(true);
  OPEN_OR_SKIP();
  ASSERT_EQ(report_.records.size(), 5u);
  EXPECT_EQ(report_.bytes_on_disk, bytes_on_disk);
  EXPECT_EQ(store_->stats().bytes_on_disk, bytes_on_disk);
  EXPECT_EQ(report_.temp_files_removed + report_.garbage_removed + report_.other_version_records, 0u);
  for (const RecordInfo& r : report_.records) {
    EXPECT_NE(r.id, ids[2]);
    EXPECT_EQ(r.id, record_id_for(r.header));
    EXPECT_EQ(r.file_bytes, record_layout(r.header.image_bytes, r.header.checksum_chunk_bytes).file_bytes);
  }
  // And each is restorable bit-exact after the restart.
  for (uint64_t k : {1, 2, 4, 5, 6}) {
    AlignedImage dst(k * 300000, 77);
    ASSERT_EQ(restore_sync(ids[k - 1], dst.data, k * 300000).status, Status::Ok);
    EXPECT_EQ(memcmp(dst.data, images[k - 1]->data, k * 300000), 0);
  }
}

TEST_F(DiskTest, RecoveryRemovesLeftoverTempFilesAndGarbage) {
  OPEN_OR_SKIP();
  store_.reset();
  write_file(store_dir_ + "/ab/abababababababababababababababab.17.tmp", std::string(8192, 'x'));
  write_file(store_dir_ + "/00/not-a-record", "hello");
  write_file(store_dir_ + "/01/01010101010101010101010101010101.kvr", std::string(12288, '\0'));  // zeroed
  OPEN_OR_SKIP();
  EXPECT_EQ(report_.temp_files_removed, 1u);
  EXPECT_EQ(report_.garbage_removed, 2u);
  EXPECT_TRUE(report_.records.empty());
  EXPECT_EQ(count_files_with_suffix(store_dir_, ".tmp"), 0u);
  EXPECT_FALSE(std::filesystem::exists(store_dir_ + "/00/not-a-record"));
}

TEST_F(DiskTest, OtherFormatVersionIsReportedNotIndexedNotDeleted) {
  OPEN_OR_SKIP();
  AlignedImage src(8192, 3);
  DiskCompletion c = spill_sync(make_meta(3, 8192), src.data);
  ASSERT_EQ(c.status, Status::Ok);
  std::string path = store_->record_path(c.id);
  store_.reset();
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  RecordHeader h;
  ASSERT_EQ(pread(fd, &h, sizeof h, 0), static_cast<ssize_t>(sizeof h));
  h.format_version = record_format_version + 1;
  h.header_checksum = record_header_checksum(h);
  ASSERT_EQ(pwrite(fd, &h, sizeof h, 0), static_cast<ssize_t>(sizeof h));
  close(fd);
  OPEN_OR_SKIP();
  EXPECT_EQ(report_.other_version_records, 1u);
  ASSERT_EQ(report_.other_version_paths.size(), 1u);
  EXPECT_EQ(report_.other_version_paths[0], path);
  EXPECT_TRUE(report_.records.empty());
  EXPECT_EQ(report_.garbage_removed, 0u);
  EXPECT_TRUE(std::filesystem::exists(path));
  AlignedImage dst(8192);
  EXPECT_EQ(restore_sync(c.id, dst.data, 8192).status, Status::NotFound);
}

TEST_F(DiskTest, SpillOfExistingKeyReplacesIt) {
  OPEN_OR_SKIP();
  AlignedImage first(1 << 20, 1), second(1 << 20, 2);
  ASSERT_EQ(spill_sync(make_meta(9, 1 << 20), first.data).status, Status::Ok);
  DiskCompletion c = spill_sync(make_meta(9, 1 << 20), second.data);
  ASSERT_EQ(c.status, Status::Ok);
  EXPECT_EQ(store_->stats().records, 1u);
  EXPECT_EQ(store_->stats().bytes_on_disk, c.bytes);
  AlignedImage dst(1 << 20);
  ASSERT_EQ(restore_sync(c.id, dst.data, 1 << 20).status, Status::Ok);
  EXPECT_EQ(memcmp(dst.data, second.data, 1 << 20), 0);
}

TEST_F(DiskTest, RemoveUnlinksAndFreesTheBytes) {
  OPEN_OR_SKIP();
  AlignedImage src(1 << 20, 1);
  DiskCompletion c = spill_sync(make_meta(4, 1 << 20), src.data);
  ASSERT_EQ(c.status, Status::Ok);
  std::string path = store_->record_path(c.id);
  ASSERT_TRUE(std::filesystem::exists(path));
  store_->remove(c.id);
  AlignedImage dst(1 << 20);
  EXPECT_EQ(restore_sync(c.id, dst.data, 1 << 20).status, Status::NotFound);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(store_->stats().bytes_on_disk, 0u);
  EXPECT_EQ(store_->stats().records, 0u);
}

TEST_F(DiskTest, RemoveCancelsAQueuedSpillOfTheSameRecord) {
  OPEN_OR_SKIP(nullptr, 2);
  // Four spills of other keys occupy the active slots; the fifth (key 100) is still queued.
  std::vector<std::unique_ptr<AlignedImage>> images;
  for (uint64_t k = 1; k <= 5; ++k) {
    images.push_back(std::make_unique<AlignedImage>(8 << 20, k));
    store_->spill(make_meta(k == 5 ? 100 : k, 8 << 20), images.back()->data);
  }
  store_->remove(record_id_for(make_meta(100, 8 << 20)));
  auto done = wait_completions(*store_, 5);
  ASSERT_EQ(done.size(), 5u);
  for (const auto& c : done) {
    if (c.id == record_id_for(make_meta(100, 8 << 20))) {
      EXPECT_EQ(c.status, Status::NotFound);
      EXPECT_EQ(c.err, ECANCELED);
    } else {
      EXPECT_EQ(c.status, Status::Ok);
    }
  }
  EXPECT_EQ(store_->stats().records, 4u);
  EXPECT_EQ(count_files_with_suffix(store_dir_, ".tmp"), 0u);
}

TEST_F(DiskTest, RestoresOvertakeQueuedSpills) {
  OPEN_OR_SKIP(nullptr, 4, 1);
  AlignedImage small(1 << 20, 1);
  DiskCompletion sc = spill_sync(make_meta(1, 1 << 20), small.data);
  ASSERT_EQ(sc.status, Status::Ok);
  constexpr int spills = 12;
  std::vector<std::unique_ptr<AlignedImage>> images;
  for (int k = 0; k < spills; ++k) images.push_back(std::make_unique<AlignedImage>(4 << 20, 10 + k));
  AlignedImage dst(1 << 20);
  // Queue everything at once (images are filled first) so the restore arrives behind 12 spills.
  for (int k = 0; k < spills; ++k) store_->spill(make_meta(10 + k, 4 << 20), images[k]->data);
  uint64_t restore_job = store_->restore(sc.id, dst.data, 1 << 20);
  auto done = wait_completions(*store_, spills + 1);
  ASSERT_EQ(done.size(), static_cast<size_t>(spills + 1));
  size_t position = 0;
  for (size_t i = 0; i < done.size(); ++i)
    if (done[i].job_id == restore_job) position = i;
  EXPECT_EQ(done[position].status, Status::Ok);
  // FIFO service would put it last (position 12). Only spills already renaming when the
  // restore arrived may finish before it.
  EXPECT_LE(position, 4u) << "restore completed after " << position << " of " << spills << " queued spills";
  EXPECT_EQ(memcmp(dst.data, small.data, 1 << 20), 0);
}

TEST_F(DiskTest, ShutdownWithoutDrainCancelsQueuedJobsAndLeavesNoTempFile) {
  OPEN_OR_SKIP(nullptr, 4);
  std::vector<std::unique_ptr<AlignedImage>> images;
  for (uint64_t k = 0; k < 10; ++k) {
    images.push_back(std::make_unique<AlignedImage>(4 << 20, k));
    store_->spill(make_meta(k, 4 << 20), images.back()->data);
  }
  store_->shutdown(false);
  std::vector<DiskCompletion> done;
  store_->take_completions(done);
  ASSERT_EQ(done.size(), 10u);
  size_t cancelled = 0;
  for (const auto& c : done) {
    if (c.status == Status::Unavailable) {
      EXPECT_EQ(c.err, ECANCELED);
      ++cancelled;
    } else {
      EXPECT_EQ(c.status, Status::Ok);
    }
  }
  EXPECT_GT(cancelled, 0u);
  EXPECT_EQ(count_files_with_suffix(store_dir_, ".tmp"), 0u);
  EXPECT_EQ(count_files_with_suffix(store_dir_, ".kvr"), 10u - cancelled);
}

TEST_F(DiskTest, OpenWithMissingParentIsNotFound) {
  std::unique_ptr<DiskStore> store;
  RecoveryReport report;
  OpenError err;
  DiskStoreOptions o;
  o.directory = dir_ + "/missing/store";
  EXPECT_EQ(DiskStore::open(std::move(o), store, report, &err), Status::NotFound);
  EXPECT_EQ(err.err, ENOENT);
  EXPECT_NE(err.detail.find("parent"), std::string::npos) << err.detail;
  EXPECT_EQ(store, nullptr);
}

TEST_F(DiskTest, OpenUnderARegularFileIsInvalidArgument) {
  write_file(dir_ + "/file", "x");
  for (std::string path : {dir_ + "/file", dir_ + "/file/store"}) {
    std::unique_ptr<DiskStore> store;
    RecoveryReport report;
    OpenError err;
    DiskStoreOptions o;
    o.directory = path;
    EXPECT_EQ(DiskStore::open(std::move(o), store, report, &err), Status::InvalidArgument) << path;
    EXPECT_EQ(err.err, ENOTDIR) << path << ": " << err.detail;
  }
}

// A directory the daemon may read but not write is served read-only, not refused.
TEST_F(DiskTest, OpenOfReadOnlyDirectoryServesReadOnly) {
  ASSERT_EQ(mkdir(store_dir_.c_str(), 0555), 0);
  ASSERT_EQ(chmod(store_dir_.c_str(), 0555), 0);
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  auto attempt = [&]() -> int {
    std::unique_ptr<DiskStore> store;
    RecoveryReport report;
    OpenError err;
    DiskStoreOptions o;
    o.directory = store_dir_;
    const Status s = DiskStore::open(std::move(o), store, report, &err);
    // 0: opened read-only, as it must be; otherwise 50 + the status.
    return s == Status::Ok && report.read_only && store->read_only() ? 0 : 50 + static_cast<int>(s);
  };
  if (geteuid() != 0) {
    EXPECT_EQ(attempt(), 0);
    return;
  }
  // Root bypasses mode bits: try as nobody in a child process.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(100);
    _exit(attempt());
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  if (WEXITSTATUS(wstatus) == 100) GTEST_SKIP() << "cannot drop privileges to nobody";
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
}

TEST_F(DiskTest, OpenRejectsBadOptions) {
  for (uint32_t chunk : {4096u, 3u << 20, 32u << 20}) {
    std::unique_ptr<DiskStore> store;
    RecoveryReport report;
    DiskStoreOptions o;
    o.directory = store_dir_;
    o.chunk_bytes = chunk;
    EXPECT_EQ(DiskStore::open(std::move(o), store, report), Status::InvalidArgument) << chunk;
  }
}

TEST_F(DiskTest, RegistersFixedBuffersAndRestoresIntoThem) {
  AlignedImage arena(8 << 20, 5);
  std::unique_ptr<DiskStore> store;
  RecoveryReport report;
  OpenError err;
  DiskStoreOptions o;
  o.directory = store_dir_;
  o.fixed_buffers = {iovec{arena.data, arena.bytes}};
  Status s = DiskStore::open(std::move(o), store, report, &err);
  if (s == Status::InvalidArgument && err.detail.find("O_DIRECT") != std::string::npos) GTEST_SKIP() << err.detail;
  ASSERT_EQ(s, Status::Ok) << err.detail;
  if (!report.fixed_buffers_registered) {
    ASSERT_FALSE(report.engine_notes.empty()) << "a failed registration must say why";
  }
  std::vector<uint8_t> copy(arena.data, arena.data + (4 << 20));
  store->spill(make_meta(1, 4 << 20), arena.data);
  auto c = wait_completions(*store, 1);
  ASSERT_EQ(c.size(), 1u);
  ASSERT_EQ(c[0].status, Status::Ok);
  store->restore(c[0].id, arena.data + (4 << 20), 4 << 20);
  c = wait_completions(*store, 1);
  ASSERT_EQ(c.size(), 1u);
  ASSERT_EQ(c[0].status, Status::Ok);
  EXPECT_EQ(memcmp(arena.data + (4 << 20), copy.data(), 4 << 20), 0);
}
