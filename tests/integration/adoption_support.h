// What the adoption tests share: a daemon whose arena the harness keeps as a service
// manager would (tests/testing/fd_store.h), heads published into it and verified byte
// for byte, and its log and stats read back.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "shm/state_segment.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"

namespace kvpark::testing {

inline constexpr const char* state_fd_name = "kvpark-state";
inline const std::vector<std::string> stored_names = {"kvpark-arena-header", "kvpark-arena-data",
                                                      state_fd_name};

// Lines of the daemon's log holding `needle`.
inline std::vector<std::string> log_lines(const DaemonProcess& daemon, const std::string& needle) {
  std::ifstream in(daemon.log_path());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) lines.push_back(line);
  }
  return lines;
}

// The log has one adoption line, and it says all `entries` were adopted and none dropped.
inline void expect_one_whole_adoption(const DaemonProcess& daemon, uint64_t entries) {
  const auto adopted = log_lines(daemon, "from the previous instance");
  ASSERT_EQ(adopted.size(), 1u);
  EXPECT_NE(adopted[0].find("adopted " + std::to_string(entries) + " entries"), std::string::npos)
      << adopted[0];
  EXPECT_NE(adopted[0].find("dropped 0"), std::string::npos) << adopted[0];
}

inline DaemonConfig kept_config(uint64_t arena_bytes = 64ull << 20) {
  return {.arena_bytes = arena_bytes, .fd_store = true};
}

// Heads of 1024 tokens (16 blocks of 64 KiB); the odd ones also park a snapshot
// 40 tokens past their last block, so snapshot records (tail tokens) ride along.
inline void publish(const DaemonProcess& daemon, const std::vector<int>& seeds) {
  for (int seed : seeds) {
    std::vector<std::string> args = {"publish", "--head-seed", std::to_string(seed)};
    if (seed % 2 == 1)
      args.insert(args.end(), {"--body-tokens", "40", "--snapshot-bytes", "12288"});
    EngineRun run = run_engine(daemon, args);
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
}

// A verify of `seed`'s prompt one token past its snapshot (a restore leaves a token).
inline std::vector<std::string> verify_args(int seed) {
  std::vector<std::string> args = {"verify", "--head-seed", std::to_string(seed)};
  if (seed % 2 == 1) args.insert(args.end(), {"--body-tokens", "41", "--snapshot-bytes", "12288"});
  return args;
}

// Every head restores as deep as it was parked, each byte checked against its
// checksum and against the content the publisher wrote (exit code 3 otherwise).
inline void expect_all_restored(const DaemonProcess& daemon, const std::vector<int>& seeds) {
  for (int seed : seeds) {
    const std::vector<std::string> args = verify_args(seed);
    EngineRun run = run_engine(daemon, args);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto r = restores_in(run.output);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].tokens, seed % 2 == 1 ? 1024u + 40 : full_restore_tokens(1024, 64))
        << "seed " << seed;
  }
}

// Garbage (seeded, the seed printed) over `count` state records from `first`, through the
// manager's own fd of a stopped daemon's state segment.
inline void scribble_records(DaemonProcess& daemon, uint64_t first, uint64_t count) {
  const int fd = daemon.fd_store().fd(state_fd_name);
  ASSERT_GE(fd, 0);
  std::unique_ptr<shm::StateSegment> segment;
  int err = 0;
  ASSERT_EQ(shm::StateSegment::adopt(dup(fd), segment, err), Status::Ok);
  const uint64_t seed = std::random_device{}();
  std::printf("scribble seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 random(seed);
  uint8_t* at = segment->base() + segment->records_offset() + first * sizeof(shm::StateRecord);
  for (uint64_t i = 0; i < count * sizeof(shm::StateRecord); ++i)
    at[i] = static_cast<uint8_t>(random());
}

// A directory for a disk tier under /var/tmp (a real file system for io_uring), removed
// with this object.
struct DiskDirectory {
  std::string path;
  explicit DiskDirectory(const char* name) {
    std::string templ = std::string("/var/tmp/") + name + "-XXXXXX";
    path = mkdtemp(templ.data());
  }
  ~DiskDirectory() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline DaemonConfig kept_disk_config(const DiskDirectory& disk) {
  return {.arena_bytes = 64ull << 20, .extra_args = {"--disk-dir", disk.path}, .fd_store = true};
}

// Publishes `seed`'s 16 blocks as shared, so they are written through to disk at seal,
// and waits until they are.
inline void publish_written_through(const DaemonProcess& daemon, int seed) {
  EngineRun run = run_engine(daemon, {"publish", "--head-seed", std::to_string(seed), "--shared"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.wait_until([](const kvpark_stats& s) { return s.disk_entries == 16; }, 30'000));
}

inline kvpark_stats stats_of(const DaemonProcess& daemon) {
  StatsClient stats(daemon.socket_path());
  EXPECT_TRUE(stats.ok());
  return stats.get();
}

inline const std::vector<int> seeds = {701, 702, 703, 704, 705};

}  // namespace kvpark::testing
