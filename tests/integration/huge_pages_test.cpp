// huge_pages = try | on | off against a real kvparkd, with what the kernel says
// backs the daemon's mapping of the arena (/proc/PID/smaps) as the judge, not only
// what the daemon reports.
//
// CI machines reserve no huge pages: there the fallback and the refusal of `on` are
// tested, and the hugetlb cases skip, naming the sysctl that would run them
// (vm.nr_hugepages; tests never change it). Where pages are reserved, the refusal
// cases skip instead and the hugetlb ones run.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/huge_pages.h"

namespace kvpark::testing {
namespace {

using std::to_string;

constexpr uint64_t arena_bytes = 64ull << 20;
constexpr uint64_t huge_page_bytes = 2ull << 20;
constexpr uint64_t snapshot_bytes = 8ull << 20;  // spans several 2 MiB pages

// Whether free reserved huge pages could hold an arena (and some to spare for the
// header's rounding): the hugetlb path is possible on this machine.
bool huge_pages_reserved_for(uint64_t bytes) {
  return meminfo_field("Hugepagesize") * 1024 == huge_page_bytes &&
         meminfo_field("HugePages_Free") * huge_page_bytes >= bytes + huge_page_bytes;
}

std::string skip_reason() {
  return "no huge pages reserved: `sysctl vm.nr_hugepages=" + to_string(arena_bytes / huge_page_bytes + 8) +
         "` runs this case";
}

// The kernel's view of the daemon's data mapping: its KernelPageSize (KiB) and how
// much of it sits on PMD-mapped (2 MiB) shmem pages.
struct Mapping {
  bool found = false;
  uint64_t kernel_page_kib = 0;
  uint64_t pmd_mapped_kib = 0;
};

Mapping arena_mapping(pid_t pid, const std::string& arena_name) {
  const std::string name = arena_name.substr(arena_name.rfind('/') + 1);
  std::ifstream in("/proc/" + to_string(pid) + "/smaps");
  std::string line;
  Mapping m;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.find('-') < line.find(' ')) {  // a mapping's first line: "start-end perms ... path"
      inside = line.find("memfd:") != std::string::npos && line.find(name) != std::string::npos &&
               line.find(name + "-header") == std::string::npos;
      if (inside) m.found = true;
      continue;
    }
    if (!inside) continue;
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    fields >> key >> kib;
    if (key == "KernelPageSize:") m.kernel_page_kib = std::max(m.kernel_page_kib, kib);
    if (key == "ShmemPmdMapped:" || key == "FilePmdMapped:") m.pmd_mapped_kib += kib;
  }
  return m;
}

std::vector<std::string> snapshot_args(std::vector<std::string> args, size_t body_tokens) {
  args.insert(args.end(), {"--ns", "12", "--block-tokens", "0", "--head-seed", "7", "--head-tokens", "600",
                           "--body-seed", "8", "--body-tokens", to_string(body_tokens),
                           "--snapshot-bytes", to_string(snapshot_bytes)});
  return args;
}

// One engine process publishes a snapshot, another restores it for a prompt one
// token longer and checks every byte.
void expect_publish_and_restore(const DaemonProcess& daemon) {
  EngineRun p = run_engine(daemon, snapshot_args({"publish", "--session", "1"}, 5));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EngineRun v = run_engine(daemon, snapshot_args({"verify", "--session", "2"}, 6));
  EXPECT_EQ(v.exit_code, 0) << v.output;  // 3: the bytes differ
  const auto r = restores_in(v.output);
  ASSERT_EQ(r.size(), 1u) << v.output;
  EXPECT_GT(r[0].tokens, 0u) << "the published snapshot did not restore";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

size_t count_lines_with(const std::string& text, const std::string& needle) {
  std::istringstream lines(text);
  std::string line;
  size_t n = 0;
  while (std::getline(lines, line)) n += line.find(needle) != std::string::npos;
  return n;
}

DaemonConfig with_huge_pages(const char* setting) {
  return {.arena_bytes = arena_bytes, .extra_args = {"--huge-pages", setting}};
}

TEST(HugePages, OffBacksTheArenaWithSmallPagesAndSaysSo) {
  DaemonProcess daemon(with_huge_pages("off"));
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  const kvpark_stats s = stats.get();
  EXPECT_EQ(s.arena_pages, 0u);
  EXPECT_EQ(s.arena_page_bytes, 4096u);
  const Mapping m = arena_mapping(daemon.pid(), daemon.arena_name());
  ASSERT_TRUE(m.found) << "no mapping of the arena memfd in the daemon's smaps";
  EXPECT_EQ(m.kernel_page_kib, 4u);
  EXPECT_EQ(m.pmd_mapped_kib, 0u);
  expect_publish_and_restore(daemon);
}

TEST(HugePages, TryWithoutReservedPagesFallsBackWithOneLogLineAndServes) {
  if (huge_pages_reserved_for(arena_bytes)) GTEST_SKIP() << "huge pages are reserved here: try uses them";
  DaemonProcess daemon(with_huge_pages("try"));
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  const kvpark_stats s = stats.get();
  EXPECT_NE(s.arena_pages, 2u) << "reports hugetlb with no huge pages reserved";
  const Mapping m = arena_mapping(daemon.pid(), daemon.arena_name());
  ASSERT_TRUE(m.found);
  EXPECT_EQ(m.kernel_page_kib, 4u);
  // What the daemon reports is what the kernel mapped: thp only with PMD mappings.
  if (s.arena_pages == 1) {
    EXPECT_GT(m.pmd_mapped_kib, 0u);
    EXPECT_EQ(s.arena_page_bytes, huge_page_bytes);
  } else {
    EXPECT_EQ(s.arena_page_bytes, 4096u);
  }
  const std::string log = read_file(daemon.log_path());
  EXPECT_EQ(count_lines_with(log, "no hugetlb pages"), 1u) << log;
  EXPECT_EQ(count_lines_with(log, "vm.nr_hugepages"), 1u) << log;
  expect_publish_and_restore(daemon);
}

TEST(HugePages, OnWithoutReservedPagesRefusesToStartNamingTheSysctl) {
  if (huge_pages_reserved_for(arena_bytes)) GTEST_SKIP() << "huge pages are reserved here: on starts";
  DaemonProcess daemon(with_huge_pages("on"));
  EXPECT_FALSE(daemon.start()) << "started with huge_pages = on and no huge pages reserved";
  const std::string log = read_file(daemon.log_path());
  EXPECT_NE(log.find("huge_pages = on"), std::string::npos) << log;
  EXPECT_NE(log.find("vm.nr_hugepages"), std::string::npos) << log;
}

TEST(HugePages, ABadSettingIsRefusedNamingTheAllowedValues) {
  DaemonProcess daemon(with_huge_pages("sometimes"));
  EXPECT_FALSE(daemon.start());
  const std::string log = read_file(daemon.log_path());
  EXPECT_NE(log.find("sometimes"), std::string::npos) << log;
  EXPECT_NE(log.find("try"), std::string::npos) << log;
}

// With pages reserved, both try and on back the arena with hugetlb pages, the
// kernel agrees, and engines publish and restore through it.
class Reserved : public ::testing::TestWithParam<const char*> {};

TEST_P(Reserved, HugetlbBacksTheArenaAndEnginesRestoreThroughIt) {
  if (!huge_pages_reserved_for(arena_bytes)) GTEST_SKIP() << skip_reason();
  DaemonProcess daemon(with_huge_pages(GetParam()));
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  const kvpark_stats s = stats.get();
  EXPECT_EQ(s.arena_pages, 2u);
  EXPECT_EQ(s.arena_page_bytes, huge_page_bytes);
  const Mapping m = arena_mapping(daemon.pid(), daemon.arena_name());
  ASSERT_TRUE(m.found);
  EXPECT_EQ(m.kernel_page_kib, huge_page_bytes / 1024);
  EXPECT_EQ(count_lines_with(read_file(daemon.log_path()), "no hugetlb pages"), 0u);
  expect_publish_and_restore(daemon);
}

INSTANTIATE_TEST_SUITE_P(TryAndOn, Reserved, ::testing::Values("try", "on"));

}  // namespace
}  // namespace kvpark::testing
