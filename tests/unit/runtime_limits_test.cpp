// The ranges kvparkctl set-limit accepts (daemon/runtime_limits.h), each at its
// edge and one past it, and the messages that name the cause.
#include <gtest/gtest.h>

#include "daemon/runtime_limits.h"
#include "proto/limits.h"

using kvpark::Status;
using namespace kvpark::daemon;

namespace {

constexpr uint64_t arena_bytes = 512ull << 20;
constexpr uint64_t filesystem_bytes = 71'000'000'000;

const LimitBounds with_disk{.arena_bytes = arena_bytes,
                            .disk_enabled = true,
                            .disk_directory = "/var/lib/kvpark",
                            .disk_filesystem_bytes = filesystem_bytes};
const LimitBounds without_disk{.arena_bytes = arena_bytes};

Status check(const std::string& name, uint64_t value, const LimitBounds& bounds,
             std::string* ret_message = nullptr) {
  std::string message;
  const Status s = check_runtime_limit(name, value, bounds, message);
  if (ret_message != nullptr) *ret_message = message;
  return s;
}

TEST(RuntimeLimits, ArenaLowWaterUpToTheArena) {
  EXPECT_EQ(check("arena-low-water", 0, without_disk), Status::Ok);
  EXPECT_EQ(check("arena-low-water", arena_bytes, without_disk), Status::Ok);
  std::string message;
  EXPECT_EQ(check("arena-low-water", arena_bytes + 1, without_disk, &message),
            Status::InvalidArgument);
  EXPECT_EQ(check("arena-low-water", 2ull << 30, without_disk, &message), Status::InvalidArgument);
  EXPECT_EQ(message, "arena-low-water 2G is larger than the arena (512M): allowed 0 to 512M");
}

TEST(RuntimeLimits, ReservationMaxFromOneExtentToTheArena) {
  const uint64_t extent = kvpark::limits::extent_align_bytes;
  EXPECT_EQ(check("reservation-max", extent, without_disk), Status::Ok);
  EXPECT_EQ(check("reservation-max", extent - 1, without_disk), Status::InvalidArgument);
  EXPECT_EQ(check("reservation-max", arena_bytes, without_disk), Status::Ok);
  std::string message;
  EXPECT_EQ(check("reservation-max", arena_bytes + 1, without_disk, &message),
            Status::InvalidArgument);
  EXPECT_EQ(message,
            "reservation-max 536870913 bytes (512.0M) is larger than the arena (512M): allowed 4K "
            "to 512M");
}

TEST(RuntimeLimits, DiskCapacityUpToItsFileSystem) {
  EXPECT_EQ(check("disk-capacity", 0, with_disk), Status::Ok);
  EXPECT_EQ(check("disk-capacity", filesystem_bytes, with_disk), Status::Ok);
  std::string message;
  EXPECT_EQ(check("disk-capacity", 1ull << 40, with_disk, &message), Status::InvalidArgument);
  EXPECT_EQ(message,
            "disk-capacity 1T is larger than the file system holding /var/lib/kvpark "
            "(71000000000 bytes (66.1G)): allowed 0 to 71000000000 bytes (66.1G)");
  EXPECT_EQ(check("disk-capacity", filesystem_bytes + 1, with_disk), Status::InvalidArgument);
}

TEST(RuntimeLimits, DiskLimitsNeedADiskTier) {
  std::string message;
  EXPECT_EQ(check("disk-write-budget", 1ull << 30, without_disk, &message), Status::BadState);
  EXPECT_NE(message.find("without a disk tier"), std::string::npos) << message;
  EXPECT_EQ(check("disk-capacity", 1ull << 30, without_disk), Status::BadState);
  EXPECT_EQ(check("disk-write-budget", 0, with_disk), Status::Ok);
  EXPECT_EQ(check("disk-write-budget", UINT64_MAX, with_disk), Status::Ok);
}

TEST(RuntimeLimits, UnknownLimitIsNamedWithTheKnownOnes) {
  std::string message;
  EXPECT_EQ(check("foo", 1ull << 30, with_disk, &message), Status::InvalidArgument);
  EXPECT_EQ(message,
            "unknown limit 'foo'; the limits are arena-low-water, reservation-max, "
            "disk-capacity, disk-write-budget");
}

}  // namespace
