// A disk filled by another program under a running kvparkd: the spills fail, the
// entries stay in memory (restorable), and /v1/status and /metrics count the failures
// by cause. A real ext4 file system on a loop device (root only: skipped where mounting
// is not allowed). A read-only remount cannot be had under a running daemon (its lock
// file is open for writing); errno to cause is tested in tests/unit.
#include <gtest/gtest.h>
#include <rapidjson/document.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "tests/testing/daemon_process.h"
#include "tests/testing/daemon_status.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/openai_http.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t file_system_bytes = 32ull << 20;
constexpr int failure_wait_msec_max = 20'000;

// The program `name` on the system's path (run_process takes a full path); "" if none.
std::string system_program(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    const std::string path = std::string(dir) + "/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// An ext4 file system in an image file, loop-mounted for the test's life.
class LoopFileSystem {
 public:
  // false (with the reason) where it cannot be had: not root, no mkfs.ext4, no loop device.
  bool make(std::string* ret_why) {
    if (geteuid() != 0) return *ret_why = "needs root to mount a file system", false;
    char templ[] = "/var/tmp/kvpark-spill-test-XXXXXX";
    if (mkdtemp(templ) == nullptr) return *ret_why = "mkdtemp failed", false;
    root_ = templ;
    image_ = root_ + "/fs.img";
    mount_point_ = root_ + "/mnt";
    fs::create_directories(mount_point_);
    std::ofstream(image_).flush();
    fs::resize_file(image_, file_system_bytes);
    const std::string mkfs = system_program("mkfs.ext4"), mount = system_program("mount");
    if (mkfs.empty() || mount.empty()) return *ret_why = "needs mkfs.ext4 and mount", false;
    std::string out;
    if (run_process({mkfs, "-q", "-F", image_}, 30'000, &out) != 0)
      return *ret_why = "mkfs.ext4: " + out, false;
    if (run_process({mount, "-o", "loop", image_, mount_point_}, 30'000, &out) != 0)
      return *ret_why = "cannot loop-mount (no loop device here?): " + out, false;
    mounted_ = true;
    return true;
  }
  ~LoopFileSystem() {
    if (mounted_) umount2(mount_point_.c_str(), MNT_DETACH);
    std::error_code ec;
    if (!root_.empty()) fs::remove_all(root_, ec);
  }
  const std::string& path() const { return mount_point_; }
  // Takes all but `left_bytes` of the free space, as another program filling the disk.
  bool fill_leaving(uint64_t left_bytes) {
    const fs::space_info space = fs::space(mount_point_);
    if (space.available <= left_bytes) return true;
    const int fd = open((mount_point_ + "/filler").c_str(), O_CREAT | O_WRONLY, 0600);
    if (fd < 0) return false;
    const bool ok = posix_fallocate(fd, 0, off_t(space.available - left_bytes)) == 0;
    close(fd);
    return ok;
  }
 private:
  std::string root_, image_, mount_point_;
  bool mounted_ = false;
};

uint64_t status_number(const DaemonProcess& daemon, const char* key) {
  return daemon_status_number(daemon, key);
}

// The sample of kvpark_spill_failures_total for `cause` on /metrics; -1 when absent.
double metric_for_cause(const DaemonProcess& daemon, const std::string& cause) {
  const HttpResult r =
      http_get("http://127.0.0.1:" + std::to_string(daemon.http_port()), "/metrics");
  const std::string line = "kvpark_spill_failures_total{cause=\"" + cause + "\"} ";
  const size_t at = r.body.find(line);
  return at == std::string::npos ? -1 : std::strtod(r.body.c_str() + at + line.size(), nullptr);
}

// Publishes a shared head (written through to disk at once) of `tokens` tokens.
void publish_head(const DaemonProcess& daemon, uint64_t seed, uint64_t tokens) {
  const EngineRun run = run_engine(daemon, {"--shared", "--head-seed", std::to_string(seed),
                                            "--head-tokens", std::to_string(tokens),
                                            "--block-bytes", "65536", "publish"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST(SpillFailures, ADiskFilledUnderTheDaemonIsCountedAsNoSpace) {
  LoopFileSystem disk;
  std::string why;
  if (!disk.make(&why)) GTEST_SKIP() << why;
  DaemonProcess daemon(DaemonConfig{
      .arena_bytes = 64ull << 20,
      .extra_args = {"--config", "/dev/null", "--http-listen", "127.0.0.1:0", "--disk-dir",
                     disk.path(), "--state-dir", "off"}});
  ASSERT_TRUE(daemon.start());
  const std::string log = daemon.log_path();
  ASSERT_EQ(status_number(daemon, "spill_failures"), 0u);

  // Another program fills the disk after the daemon sized its tier.
  ASSERT_TRUE(disk.fill_leaving(256ull << 10));
  publish_head(daemon, 1, 4096);  // 64 blocks of 64 KiB: 4 MiB
  EXPECT_TRUE(wait_until([&] { return status_number(daemon, "spill_failures_no_space") > 0; },
                         failure_wait_msec_max))
      << "spills " << status_number(daemon, "spills");
  const uint64_t no_space = status_number(daemon, "spill_failures_no_space");
  EXPECT_EQ(metric_for_cause(daemon, "no_space"), double(no_space));
  EXPECT_EQ(status_number(daemon, "spill_failures_read_only"), 0u);
  // Nothing was lost: the head is still restorable from memory.
  const EngineRun verify = run_engine(daemon, {"--shared", "--head-seed", "1", "--head-tokens",
                                               "4096", "--block-bytes", "65536", "verify"});
  EXPECT_EQ(verify.exit_code, 0) << verify.output;  // the bytes restored are the bytes parked
  EXPECT_EQ(verify.output.find("restored 0 "), std::string::npos) << verify.output;

  EXPECT_EQ(status_number(daemon, "spill_failures"),
            status_number(daemon, "spill_failures_no_space") +
                status_number(daemon, "spill_failures_io_error") +
                status_number(daemon, "spill_failures_damaged_header"));
  daemon.kill_hard();
}

}  // namespace
}  // namespace kvpark::testing
