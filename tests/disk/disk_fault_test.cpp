// Faults: corrupted records on disk, and device errors injected through FaultInjectingEngine.
// The rule for all of them: a record is served only if every byte verified; a failed spill
// leaves no temp file and nothing that recovery would index.
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cstddef>
#include <set>

#include "tests/disk/disk_testing.h"

using namespace kvpark;
using namespace kvpark::disk;
using namespace kvpark::disk::testing;

namespace {
constexpr uint64_t image_bytes = 3 * (1 << 20) + 4096;  // 4 chunks, last one partial

void flip_byte(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = 0;
  ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= 0x01;
  ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  fsync(fd);
  close(fd);
}

void zero_range(const std::string& path, uint64_t offset, uint64_t bytes) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> zeros(bytes, 0);
  ASSERT_EQ(pwrite(fd, zeros.data(), bytes, static_cast<off_t>(offset)), static_cast<ssize_t>(bytes));
  fsync(fd);
  close(fd);
}

void truncate_to(const std::string& path, uint64_t bytes) { ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(bytes)), 0); }

struct Damage {
  const char* name;
  void (*apply)(const std::string& path);
};
const RecordLayout layout = record_layout(image_bytes, 1 << 20);
const Damage damages[] = {
    {"image bit flip, first chunk", [](const std::string& p) { flip_byte(p, layout.image_offset + 12345); }},
    {"image bit flip, last chunk", [](const std::string& p) { flip_byte(p, layout.image_offset + image_bytes - 1); }},
    {"checksum table bit flip", [](const std::string& p) { flip_byte(p, layout.table_offset + 9); }},
    {"header bit flip (key)", [](const std::string& p) { flip_byte(p, offsetof(RecordHeader, key_hash)); }},
    {"header bit flip (image_bytes)", [](const std::string& p) { flip_byte(p, offsetof(RecordHeader, image_bytes)); }},
    {"zeroed header", [](const std::string& p) { zero_range(p, 0, 4096); }},
    {"truncated by one page", [](const std::string& p) { truncate_to(p, layout.file_bytes - 4096); }},
    {"truncated into the header", [](const std::string& p) { truncate_to(p, 100); }},
};
}  // namespace

class DiskCorruption : public DiskTest, public ::testing::WithParamInterface<int> {};

// Damage under a running store: the restore completes Corrupt (never Ok), is counted,
// and the record is dropped so it is never tried again.
TEST_P(DiskCorruption, RestoreCompletesCorruptAndCounts) {
  const Damage& d = damages[GetParam()];
  OPEN_OR_SKIP();
  AlignedImage src(image_bytes, 11);
  DiskCompletion sc = spill_sync(make_meta(11, image_bytes), src.data);
  ASSERT_EQ(sc.status, Status::Ok);
  std::string path = store_->record_path(sc.id);
  d.apply(path);
  AlignedImage dst(image_bytes, 12);
  DiskCompletion rc = restore_sync(sc.id, dst.data, image_bytes);
  EXPECT_EQ(rc.status, Status::Corrupt) << d.name;
  EXPECT_EQ(store_->stats().checksum_failures, 1u) << d.name;
  EXPECT_EQ(store_->stats().restores_completed, 0u) << d.name;
  EXPECT_FALSE(std::filesystem::exists(path)) << d.name << ": a corrupt record must be dropped";
  EXPECT_EQ(store_->stats().records, 0u);
  EXPECT_EQ(restore_sync(sc.id, dst.data, image_bytes).status, Status::NotFound) << d.name;
}

// Damage while the daemon is down: recovery either drops the record (header, size) or
// indexes it and the restore refuses it (image, table). Never Ok.
TEST_P(DiskCorruption, AfterReopenRecordIsDroppedOrRefused) {
  const Damage& d = damages[GetParam()];
  OPEN_OR_SKIP();
  AlignedImage src(image_bytes, 21);
  DiskCompletion sc = spill_sync(make_meta(21, image_bytes), src.data);
  ASSERT_EQ(sc.status, Status::Ok);
  std::string path = store_->record_path(sc.id);
  store_.reset();
  d.apply(path);
  OPEN_OR_SKIP();
  AlignedImage dst(image_bytes, 22);
  DiskCompletion rc = restore_sync(sc.id, dst.data, image_bytes);
  if (report_.records.empty()) {
    EXPECT_EQ(report_.garbage_removed, 1u) << d.name;
    EXPECT_EQ(rc.status, Status::NotFound) << d.name;
  } else {
    EXPECT_EQ(rc.status, Status::Corrupt) << d.name;
    EXPECT_EQ(store_->stats().checksum_failures, 1u) << d.name;
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << d.name;
}

INSTANTIATE_TEST_SUITE_P(EveryDamage, DiskCorruption, ::testing::Range(0, static_cast<int>(std::size(damages))),
                         [](const auto& param_info) {
                           std::string n = damages[param_info.param].name;
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// ---- injected device faults ------------------------------------------------------

class DiskFault : public DiskTest {
 protected:
  // Spill that should fail; checks the documented status and that nothing is left behind.
  void expect_failed_spill(Status status, int err) {
    AlignedImage src(image_bytes, 5);
    DiskCompletion c = spill_sync(make_meta(5, image_bytes), src.data);
    EXPECT_EQ(c.status, status);
    EXPECT_EQ(c.err, err);
    EXPECT_EQ(count_files_with_suffix(store_dir_, ".tmp"), 0u) << "temp file left behind";
    EXPECT_EQ(count_files_with_suffix(store_dir_, ".kvr"), 0u) << "failed spill left a record";
    EXPECT_EQ(store_->stats().records, 0u);
    EXPECT_EQ(store_->stats().spills_failed, 1u);
    // The store keeps working once the device does.
    faults_->clear_rules();
    AlignedImage ok(image_bytes, 6);
    EXPECT_EQ(spill_sync(make_meta(6, image_bytes), ok.data).status, Status::Ok);
  }
  FaultInjectingEngine* faults_ = nullptr;
};

TEST_F(DiskFault, EioOnWriteFailsTheSpill) {
  OPEN_OR_SKIP(fault_engine(&faults_));
  faults_->add_rule(FaultRule{.op = IoOp::Write, .nth = 2, .error = EIO});
  expect_failed_spill(Status::IoError, EIO);
  EXPECT_EQ(store_->stats().io_errors, 1u);
}

TEST_F(DiskFault, EnospcOnWriteFailsTheSpillAndCounts) {
  OPEN_OR_SKIP(fault_engine(&faults_));
  faults_->add_rule(FaultRule{.op = IoOp::Write, .nth = 3, .error = ENOSPC});
  expect_failed_spill(Status::IoError, ENOSPC);
  EXPECT_EQ(store_->stats().enospc, 1u);
}

TEST_F(DiskFault, EioOnFsyncFailsTheSpill) {
  OPEN_OR_SKIP(fault_engine(&faults_));
  faults_->add_rule(FaultRule{.op = IoOp::Fsync, .nth = 1, .error = EIO});
  expect_failed_spill(Status::IoError, EIO);
}

TEST_F(DiskFault, EioOnDirectoryFsyncDropsTheRenamedRecord) {
  OPEN_OR_SKIP(fault_engine(&faults_));
  faults_->add_rule(FaultRule{.op = IoOp::Fsync, .nth = 2, .error = EIO});
  expect_failed_spill(Status::IoError, EIO);
}

TEST_F(DiskFault, PersistentShortWritesFailTheSpill) {
  OPEN_OR_SKIP(fault_engine(&faults_));
  faults_->add_rule(FaultRule{.op = IoOp::Write, .times = 0, .action = FaultRule::Action::ShortTransfer});
  expect_failed_spill(Status::IoError, EIO);
}

TEST_F(DiskFault, OneShortWriteIsResubmittedAndTheRecordIsExact) {
  OPEN_OR_SKIP(fault_engine(&faults_));
  faults_->add_rule(FaultRule{.op = IoOp::Write, .nth = 1, .action = FaultRule::Action::ShortTransfer});
  AlignedImage src(image_bytes, 8);
  DiskCompletion sc = spill_sync(make_meta(8, image_bytes), src.data);
  ASSERT_EQ(sc.status, Status::Ok);
  EXPECT_EQ(faults_->faults_injected(), 1u);
  AlignedImage dst(image_bytes, 9);
  ASSERT_EQ(restore_sync(sc.id, dst.data, image_bytes).status, Status::Ok);
  EXPECT_EQ(memcmp(src.data, dst.data, image_bytes), 0);
}

class DiskReadFault : public DiskFault {
 protected:
  void SetUp() override {
    DiskFault::SetUp();
    if (!open_store(fault_engine(&faults_))) GTEST_SKIP() << skip_reason_;
    src_ = std::make_unique<AlignedImage>(image_bytes, 31);
    DiskCompletion sc = spill_sync(make_meta(31, image_bytes), src_->data);
    ASSERT_EQ(sc.status, Status::Ok);
    id_ = sc.id;
  }
  std::unique_ptr<AlignedImage> src_;
  RecordId id_;
};

TEST_F(DiskReadFault, EioOnReadFailsTheRestoreAndKeepsTheRecord) {
  faults_->add_rule(FaultRule{.op = IoOp::Read, .nth = 2, .error = EIO});
  AlignedImage dst(image_bytes);
  DiskCompletion c = restore_sync(id_, dst.data, image_bytes);
  EXPECT_EQ(c.status, Status::IoError);
  EXPECT_EQ(c.err, EIO);
  EXPECT_EQ(store_->stats().io_errors, 1u);
  EXPECT_EQ(store_->stats().checksum_failures, 0u);
  // A device error is not corruption: the record stays and a retry succeeds.
  ASSERT_EQ(restore_sync(id_, dst.data, image_bytes).status, Status::Ok);
  EXPECT_EQ(memcmp(src_->data, dst.data, image_bytes), 0);
}

TEST_F(DiskReadFault, OneShortReadIsResubmittedAndExact) {
  faults_->add_rule(FaultRule{.op = IoOp::Read, .nth = 3, .action = FaultRule::Action::ShortTransfer});
  AlignedImage dst(image_bytes);
  ASSERT_EQ(restore_sync(id_, dst.data, image_bytes).status, Status::Ok);
  EXPECT_EQ(faults_->faults_injected(), 1u);
  EXPECT_EQ(memcmp(src_->data, dst.data, image_bytes), 0);
}

TEST_F(DiskReadFault, PersistentShortReadsFailTheRestore) {
  faults_->add_rule(FaultRule{.op = IoOp::Read, .times = 0, .action = FaultRule::Action::ShortTransfer});
  AlignedImage dst(image_bytes);
  DiskCompletion c = restore_sync(id_, dst.data, image_bytes);
  EXPECT_EQ(c.status, Status::IoError);
  EXPECT_EQ(c.err, EIO);
}

TEST_F(DiskReadFault, EintrIsRetried) {
  faults_->add_rule(FaultRule{.op = IoOp::Read, .nth = 1, .times = 1, .error = EINTR});
  AlignedImage dst(image_bytes);
  ASSERT_EQ(restore_sync(id_, dst.data, image_bytes).status, Status::Ok);
  EXPECT_EQ(memcmp(src_->data, dst.data, image_bytes), 0);
}

TEST_F(DiskReadFault, EndlessEagainGivesUpAfterTheBound) {
  faults_->add_rule(FaultRule{.op = IoOp::Read, .times = 0, .error = EAGAIN});
  AlignedImage dst(image_bytes);
  DiskCompletion c = restore_sync(id_, dst.data, image_bytes);
  EXPECT_EQ(c.status, Status::IoError);
  EXPECT_EQ(c.err, EAGAIN);
}

TEST_F(DiskReadFault, FaultsByPathHitOnlyThatRecord) {
  AlignedImage other(image_bytes, 41);
  DiskCompletion oc = spill_sync(make_meta(41, image_bytes), other.data);
  ASSERT_EQ(oc.status, Status::Ok);
  faults_->add_rule(FaultRule{.any_op = true, .path_contains = record_id_hex(id_), .times = 0, .error = EIO});
  AlignedImage dst(image_bytes);
  EXPECT_EQ(restore_sync(id_, dst.data, image_bytes).status, Status::IoError);
  EXPECT_EQ(restore_sync(oc.id, dst.data, image_bytes).status, Status::Ok);
}

// Seeded random faults over many spills: after a reopen, exactly the spills that
// completed Ok are indexed, and no temp file survives.
TEST_F(DiskFault, RandomFaultsLeaveExactlyTheCompletedRecords) {
  OPEN_OR_SKIP(fault_engine(&faults_, 16, 20240607));
  faults_->add_rule(FaultRule{.any_op = true, .probability = 0.08, .times = 0, .error = EIO});
  constexpr int spills = 40;
  std::vector<std::unique_ptr<AlignedImage>> images;
  for (int k = 0; k < spills; ++k) {
    images.push_back(std::make_unique<AlignedImage>((k % 4 + 1) * 700000, k));
    store_->spill(make_meta(1000 + k, (k % 4 + 1) * 700000), images.back()->data);
  }
  auto done = wait_completions(*store_, spills);
  ASSERT_EQ(done.size(), static_cast<size_t>(spills));
  std::set<RecordId> ok;
  for (const auto& c : done) {
    ASSERT_TRUE(c.status == Status::Ok || c.status == Status::IoError) << status_name(c.status);
    if (c.status == Status::Ok) ok.insert(c.id);
  }
  EXPECT_GT(faults_->faults_injected(), 0u);
  EXPECT_LT(ok.size(), static_cast<size_t>(spills)) << "no spill failed: the rule did not bite";
  EXPECT_EQ(count_files_with_suffix(store_dir_, ".tmp"), 0u);
  store_.reset();
  OPEN_OR_SKIP();
  std::set<RecordId> indexed;
  for (const auto& r : report_.records) indexed.insert(r.id);
  EXPECT_EQ(indexed, ok);
  EXPECT_EQ(report_.temp_files_removed, 0u);
  EXPECT_EQ(report_.garbage_removed, 0u);
}
