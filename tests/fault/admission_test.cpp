// Who gets a connection, against a real kvparkd: one daemon per socket path, the
// handshake deadline, the per-uid and global connection caps at N and N+1 (several
// processes, several uids), and HELLO geometry no reservation could ever hold.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "proto/limits.h"
#include "shm/arena_format.h"
#include "tests/fault/observer.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait.h"
#include "tests/testing/raw_client.h"

namespace kvpark::testing {
namespace {

constexpr uid_t nobody_uid = 65534;
constexpr gid_t nogroup_gid = 65534;
constexpr uid_t other_uid = 65533;  // a third user, in the attach group too

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

kvpark_namespace make_ns(uint64_t id, uint32_t block_tokens, uint64_t block_bytes) {
  return {.id = {id, 0xad},
          .block_tokens = block_tokens,
          .block_payload_bytes = block_bytes,
          .snapshot_required = 0,
          .prefill_tokens_per_second = 0,
          .client_name = "admission"};
}

kvpark_status try_connect(const std::string& socket, const kvpark_namespace& ns) {
  kvpark_client* c = nullptr;
  const kvpark_status s = kvpark_connect(socket.c_str(), &ns, &c);
  kvpark_disconnect(c);
  return s;
}

// A child process holding `count` connections (greeted or silent), optionally as
// another user. It reports how many HELLOs were answered Ok, then holds its sockets
// until the parent lets go of it.
class Holder {
 public:
  Holder(const std::string& socket, size_t count, bool greet, uid_t uid = geteuid(),
         gid_t gid = nogroup_gid) {
    int report[2], hold[2];
    if (pipe(report) != 0 || pipe(hold) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(report[0]);
      close(hold[1]);
      if (uid != geteuid() && (setgroups(0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
                               setresuid(uid, uid, uid) != 0)) {
        _exit(100);
      }
      std::vector<RawClient> peers;
      uint32_t ok = 0;
      for (size_t i = 0; i < count; ++i) {
        peers.emplace_back(socket);
        if (!greet) {
          ok += peers.back().connected() ? 1 : 0;
          continue;
        }
        ok += peers.back().hello({0x401d, (uint64_t(getpid()) << 16) | i},
                                 {.block_tokens = 16, .block_payload_bytes = 4096}) == Status::Ok;
      }
      (void)!write(report[1], &ok, sizeof ok);
      char byte;
      (void)!read(hold[0], &byte, 1);  // EOF: the parent is done with us
      _exit(0);
    }
    close(report[1]);
    close(hold[0]);
    hold_fd_ = hold[1];
    if (read(report[0], &answered_, sizeof answered_) != sizeof answered_) answered_ = UINT32_MAX;
    close(report[0]);
  }
  ~Holder() {
    if (hold_fd_ >= 0) close(hold_fd_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  uint32_t answered() const { return answered_; }  // UINT32_MAX: the child failed

 private:
  pid_t pid_ = -1;
  int hold_fd_ = -1;
  uint32_t answered_ = UINT32_MAX;
};

class Admission : public ::testing::Test {
 protected:
  void SetUp() override {
    if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
  }
  void start(std::vector<std::string> extra = {}) {
    daemon_ = std::make_unique<DaemonProcess>(DaemonConfig{.extra_args = std::move(extra)});
    ASSERT_TRUE(daemon_->start()) << read_file(daemon_->log_path());
    ASSERT_EQ(observer_.connect(daemon_->socket_path()), KVPARK_OK);
    observer_.publish_and_verify();
  }
  // Lets other users reach the socket's directory, as the unit's RuntimeDirectory does
  // (the socket itself is in the attach group: the daemon gives it).
  void open_socket_to_attach_group() {
    const std::string dir = std::filesystem::path(daemon_->socket_path()).parent_path();
    ASSERT_EQ(chmod(dir.c_str(), 0711), 0);
  }
  uint64_t connections() { return observer_.stats().connections; }
  bool wait_connections(uint64_t n, int timeout_msec = 5000) {
    return wait_until([&] { return connections() == n; }, timeout_msec);
  }

  std::unique_ptr<DaemonProcess> daemon_;
  Observer observer_;
};

TEST_F(Admission, SecondDaemonOnTheSameSocketRefusesAndLeavesTheFirstServing) {
  start();
  const std::string socket = daemon_->socket_path();
  std::string output;
  const int code = run_process(
      {"/bin/sh", "-c",
       built_binary("KVPARKD") + " --socket " + socket +
           " --arena-name /kvpark-admission-second-" + std::to_string(getpid()) +
           " --arena-size 16M --http-listen off --dbus off --disk-dir off 2>&1"},
      10'000, &output);
  EXPECT_EQ(code, 3) << output;  // kvparkd(8): another kvparkd already serves this socket
  EXPECT_NE(output.find(socket), std::string::npos) << output;
  EXPECT_NE(output.find("pid " + std::to_string(daemon_->pid())), std::string::npos) << output;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << "one line: " << output;
  // The socket file is still the first daemon's, and it still serves.
  EXPECT_TRUE(std::filesystem::exists(socket));
  observer_.publish_and_verify();
  EXPECT_EQ(try_connect(socket, make_ns(0x5ec0, 16, 4096)), KVPARK_OK);
  EXPECT_EQ(daemon_->stop(), 0);
  EXPECT_FALSE(std::filesystem::exists(socket)) << "its owner removes the socket at exit";
}

// Two daemons on one disk directory (another socket, the same configuration) would
// each remove the other's in-flight spills at recovery and evict records the other
// serves. The second refuses in one line naming the first, which serves on; the lock
// does not outlive a killed holder.
TEST_F(Admission, SecondDaemonOnTheSameDiskDirectoryRefusesAndLeavesTheFirstServing) {
  char templ[] = "/var/tmp/kvpark-admission-disk-XXXXXX";
  ASSERT_NE(mkdtemp(templ), nullptr);
  const std::string disk = templ;
  start({"--disk-dir", disk});
  DaemonProcess second(
      DaemonConfig{.arena_bytes = 16ull << 20, .extra_args = {"--disk-dir", disk}});
  std::string output;
  const int code = run_process(
      {"/bin/sh", "-c",
       built_binary("KVPARKD") + " --socket " + second.socket_path() +
           " --arena-name /kvpark-admission-disk-" + std::to_string(getpid()) +
           " --arena-size 16M --http-listen off --dbus off --disk-dir " + disk + " 2>&1"},
      10'000, &output);
  EXPECT_EQ(code, 3) << output;  // kvparkd(8): another kvparkd uses this disk directory
  EXPECT_NE(output.find("disk directory " + disk), std::string::npos) << output;
  EXPECT_NE(output.find("pid " + std::to_string(daemon_->pid())), std::string::npos) << output;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << "one line: " << output;
  observer_.publish_and_verify();

  daemon_->kill_hard();
  ASSERT_TRUE(second.start()) << read_file(second.log_path());
  EXPECT_EQ(try_connect(second.socket_path(), make_ns(0xd15c, 16, 4096)), KVPARK_OK);
  EXPECT_EQ(second.stop(), 0);
  std::filesystem::remove_all(disk);
}

TEST_F(Admission, StaleSocketFileIsTakenOver) {
  // A crashed daemon's socket file: bound once, nobody listening, no lock held.
  DaemonProcess probe;
  const std::string socket = probe.socket_path();
  const int fd = bind_unix_socket(socket, SOCK_SEQPACKET);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_TRUE(std::filesystem::exists(socket));
  ASSERT_TRUE(probe.start()) << read_file(probe.log_path());
  EXPECT_EQ(try_connect(socket, make_ns(0x57a1e, 16, 4096)), KVPARK_OK);
  EXPECT_EQ(probe.stop(), 0);
}

TEST_F(Admission, SilentPeerIsClosedAtTheHandshakeDeadline) {
  start();
  RawClient silent(daemon_->socket_path());
  RawClient greeted(daemon_->socket_path());
  ASSERT_TRUE(silent.connected() && greeted.connected());
  ASSERT_EQ(greeted.hello({0x9ee7, 1}, {.block_tokens = 16, .block_payload_bytes = 4096}),
            Status::Ok);
  std::vector<uint8_t> reply;
  const int wait_msec = static_cast<int>(3 * limits::hello_timeout_usec / 1000);
  EXPECT_EQ(silent.receive(reply, wait_msec), RawClient::Received::Eof);
  // The greeted peer is still served after the deadline.
  std::vector<uint8_t> stats;
  wire::encode(static_cast<uint16_t>(wire::Verb::Stats), 0, 7, stats);
  wire::FrameHeader h;
  std::vector<uint8_t> body;
  ASSERT_TRUE(greeted.call(stats, h, body));
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(read_file(daemon_->log_path()).find("sent no HELLO"), std::string::npos);
  EXPECT_EQ(daemon_->stop(), 0);
}

TEST_F(Admission, SilentFloodOfOneUserEndsAtTheDeadline) {
  start();
  // This uid's whole share, silent: the observer holds one slot of it.
  Holder a(daemon_->socket_path(), limits::connections_per_process_max, false);
  Holder b(daemon_->socket_path(), limits::connections_per_uid_max - 1 -
                                       limits::connections_per_process_max, false);
  ASSERT_NE(a.answered(), UINT32_MAX);
  ASSERT_NE(b.answered(), UINT32_MAX);
  ASSERT_TRUE(wait_connections(limits::connections_per_uid_max));
  const kvpark_namespace ns = make_ns(0xf100d, 16, 4096);
  EXPECT_EQ(try_connect(daemon_->socket_path(), ns), KVPARK_LIMIT_EXCEEDED);
  // The flood sent no HELLO: the deadline closes it and a real engine gets in.
  kvpark_status s = KVPARK_LIMIT_EXCEEDED;
  EXPECT_TRUE(wait_until([&] { return (s = try_connect(daemon_->socket_path(), ns)) == KVPARK_OK; },
                         static_cast<int>(3 * limits::hello_timeout_usec / 1000)));
  EXPECT_EQ(s, KVPARK_OK);
  EXPECT_TRUE(wait_connections(1));
  EXPECT_EQ(daemon_->stop(), 0);
}

TEST_F(Admission, ConnectionsPerUidAtCapAndCapPlusOne) {
  start({"--attach-group", "nogroup"});
  // N: the observer plus two processes of this uid.
  Holder a(daemon_->socket_path(), limits::connections_per_process_max, true);
  Holder b(daemon_->socket_path(), limits::connections_per_uid_max - 1 -
                                       limits::connections_per_process_max, true);
  EXPECT_EQ(a.answered(), limits::connections_per_process_max);
  EXPECT_EQ(b.answered(), limits::connections_per_uid_max - 1 - limits::connections_per_process_max);
  EXPECT_EQ(connections(), limits::connections_per_uid_max);
  // N+1 from the same uid: refused, clearly.
  EXPECT_EQ(try_connect(daemon_->socket_path(), make_ns(0x1, 16, 4096)), KVPARK_LIMIT_EXCEEDED);
  observer_.publish_and_verify();
  if (geteuid() != 0) GTEST_SKIP() << "another user's connection needs root to set it up";
  // Another user still gets in.
  open_socket_to_attach_group();
  Holder other(daemon_->socket_path(), 1, true, nobody_uid);
  EXPECT_EQ(other.answered(), 1u);
  EXPECT_EQ(daemon_->stop(), 0);
}

// --attach-group alone: the socket is created 0660 in that group, so a member
// connects and anyone else is refused by the kernel (EACCES), no chgrp by hand.
TEST_F(Admission, AttachGroupAloneLetsMembersInAndKeepsOthersOut) {
  if (geteuid() != 0) GTEST_SKIP() << "other users need root to set them up";
  start({"--attach-group", "nogroup"});
  struct stat st {};
  ASSERT_EQ(stat(daemon_->socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, nogroup_gid);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  open_socket_to_attach_group();
  Holder member(daemon_->socket_path(), 1, true, nobody_uid, nogroup_gid);
  EXPECT_EQ(member.answered(), 1u);
  constexpr gid_t outsider_gid = 65532;
  Holder outsider(daemon_->socket_path(), 1, false, other_uid, outsider_gid);
  EXPECT_EQ(outsider.answered(), 0u);
  observer_.publish_and_verify();
  EXPECT_EQ(daemon_->stop(), 0);
}

TEST_F(Admission, ConnectionsAtGlobalCapAndCapPlusOne) {
  if (geteuid() != 0) GTEST_SKIP() << "the global cap takes two users' shares: needs root";
  start({"--attach-group", "nogroup"});
  open_socket_to_attach_group();
  const size_t rest = limits::connections_per_uid_max - 1 - limits::connections_per_process_max;
  Holder a(daemon_->socket_path(), limits::connections_per_process_max, true);
  Holder b(daemon_->socket_path(), rest, true);
  static_assert(limits::connections_max == 2 * limits::connections_per_uid_max,
                "two users' shares fill the daemon");
  Holder c(daemon_->socket_path(), limits::connections_per_process_max, true, nobody_uid);
  Holder d(daemon_->socket_path(), rest + 1, true, nobody_uid);
  ASSERT_EQ(c.answered(), limits::connections_per_process_max);
  ASSERT_EQ(d.answered(), rest + 1);
  EXPECT_EQ(connections(), limits::connections_max);
  // N+1, from a third user whose own share is untouched: the daemon is full.
  Holder e(daemon_->socket_path(), 1, true, other_uid);
  EXPECT_EQ(e.answered(), 0u);
  EXPECT_EQ(connections(), limits::connections_max);
  observer_.publish_and_verify();
  EXPECT_EQ(daemon_->stop(), 0);
}

TEST_F(Admission, HelloGeometryNoReservationCanHoldIsRefused) {
  start();
  // DaemonConfig's 64 MiB arena: the largest reservation is half of it.
  const uint64_t reservation_max = DaemonConfig{}.arena_bytes / 2;
  const uint32_t tokens = 16;
  const uint64_t fits = reservation_max - shm::payload_offset_for(tokens);
  ASSERT_EQ(shm::extent_bytes_for(tokens, fits), reservation_max);
  EXPECT_EQ(try_connect(daemon_->socket_path(), make_ns(0x6e0, tokens, fits)), KVPARK_OK);
  EXPECT_EQ(try_connect(daemon_->socket_path(), make_ns(0x6e1, tokens, fits + 1)),
            KVPARK_LIMIT_EXCEEDED);
  // Bigger than the whole arena.
  EXPECT_EQ(try_connect(daemon_->socket_path(), make_ns(0x6e2, tokens, 128ull << 20)),
            KVPARK_LIMIT_EXCEEDED);
  observer_.publish_and_verify();
  EXPECT_EQ(daemon_->stop(), 0);
}

}  // namespace
}  // namespace kvpark::testing
