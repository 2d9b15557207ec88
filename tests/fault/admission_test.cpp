// Who gets a connection, against a real kvparkd: one daemon per socket path, the
// handshake deadline, the per-uid and global connection caps at N and N+1 (several
// processes, several uids), and HELLO geometry no reservation could ever hold.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <rapidjson/document.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "proto/limits.h"
#include "shm/arena_format.h"
#include "tests/fault/observer.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/daemon_status.h"
#include "tests/testing/openai_http.h"
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

// What a Holder's connections do once open.
enum class Hold {
  silent,    // no HELLO
  greeted,   // HELLO, then nothing: idle
  reserved,  // HELLO and one reservation never sealed: busy, never displaced
};

// A child process holding `count` connections, optionally as another user. It
// reports how many HELLOs were answered Ok, then holds its sockets until the parent
// lets go of it.
class Holder {
 public:
  Holder(const std::string& socket, size_t count, bool greet, uid_t uid = geteuid(),
         gid_t gid = nogroup_gid)
      : Holder(socket, count, greet ? Hold::greeted : Hold::silent, uid, gid) {}
  Holder(const std::string& socket, size_t count, Hold mode, uid_t uid = geteuid(),
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
      std::vector<kvpark_client*> clients;
      std::vector<kvpark_reservation*> reservations;
      uint32_t ok = 0;
      for (size_t i = 0; i < count; ++i) {
        if (mode == Hold::reserved) {
          ok += hold_reservation(socket, i, &clients, &reservations);
          continue;
        }
        peers.emplace_back(socket);
        if (mode == Hold::silent) {
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
  // A greeted connection with one block reserved and never sealed; whether both worked.
  static bool hold_reservation(const std::string& socket, size_t i,
                               std::vector<kvpark_client*>* clients,
                               std::vector<kvpark_reservation*>* reservations) {
    const kvpark_namespace ns = {.id = {0x401e, 0},
                                 .block_tokens = 16,
                                 .block_payload_bytes = 4096,
                                 .snapshot_required = 0,
                                 .prefill_tokens_per_second = 0,
                                 .client_name = "admission"};
    kvpark_client* c = nullptr;
    if (kvpark_connect(socket.c_str(), &ns, &c) != KVPARK_OK) return false;
    clients->push_back(c);
    std::vector<int32_t> tokens(16, int32_t(i));
    tokens[0] = getpid();
    const kvpark_publish_options options{};
    kvpark_reservation* r = nullptr;
    if (kvpark_reserve_blocks(c, &options, tokens.data(), tokens.size(), 0, 1, &r) != KVPARK_OK)
      return false;
    reservations->push_back(r);
    return true;
  }

  pid_t pid_ = -1;
  int hold_fd_ = -1;
  uint32_t answered_ = UINT32_MAX;
};

constexpr int churn_processes = 4;
constexpr int churn_threads = 50;
constexpr int churn_msec = 5'000;
constexpr int churn_engine_attempts = 30;

// A child process whose threads each connect (HELLO) and disconnect in a loop for
// `msec`; counts() then says how many connects were answered Ok and how many refused.
// (A deadline, not a pipe to stop on: later children would hold its write end too.)
class Churner {
 public:
  Churner(const std::string& socket, int threads, int msec) {
    int report[2];
    if (pipe(report) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(report[0]);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(msec);
      std::atomic<uint64_t> ok{0}, refused{0};
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          const kvpark_namespace ns = make_ns(0xc4a2 + uint64_t(t), 16, 4096);
          while (std::chrono::steady_clock::now() < deadline)
            (try_connect(socket, ns) == KVPARK_OK ? ok : refused) += 1;
        });
      }
      for (std::thread& w : workers) w.join();
      const uint64_t counts[2] = {ok.load(), refused.load()};
      (void)!write(report[1], counts, sizeof counts);
      _exit(0);
    }
    close(report[1]);
    report_fd_ = report[0];
  }
  ~Churner() { (void)counts(); }
  // Waits for the churn to end.
  std::pair<uint64_t, uint64_t> counts() {
    if (pid_ <= 0) return {0, 0};
    uint64_t c[2] = {0, 0};
    (void)!read(report_fd_, c, sizeof c);
    close(report_fd_);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return {c[0], c[1]};
  }

 private:
  pid_t pid_ = -1;
  int report_fd_ = -1;
};

class Admission : public ::testing::Test {
 protected:
  void SetUp() override {
    if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
  }
  void start(std::vector<std::string> extra = {}) {
    extra.insert(extra.end(), {"--http-listen", "127.0.0.1:0"});  // for displaced()
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
  // Connections closed to admit another process of their uid (/v1/status).
  uint64_t displaced() { return daemon_status_number(*daemon_, "connections_displaced"); }
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

// A silent flood of one user fills its share: a real engine of the same uid is
// admitted at once in place of the flood's oldest silent connection, and the rest
// of the flood is closed at the handshake deadline.
TEST_F(Admission, SilentFloodOfOneUserCannotLockOutAnEngine) {
  start();
  // This uid's whole share, silent: the observer holds one slot of it.
  Holder a(daemon_->socket_path(), limits::connections_per_process_max, false);
  Holder b(daemon_->socket_path(), limits::connections_per_uid_max - 1 -
                                       limits::connections_per_process_max, false);
  ASSERT_NE(a.answered(), UINT32_MAX);
  ASSERT_NE(b.answered(), UINT32_MAX);
  ASSERT_TRUE(wait_connections(limits::connections_per_uid_max));
  const kvpark_namespace ns = make_ns(0xf100d, 16, 4096);
  EXPECT_EQ(try_connect(daemon_->socket_path(), ns), KVPARK_OK);
  EXPECT_EQ(displaced(), 1u);
  // The flood sent no HELLO: the deadline closes the rest of it.
  EXPECT_TRUE(wait_connections(1, static_cast<int>(3 * limits::hello_timeout_usec / 1000)));
  EXPECT_EQ(daemon_->stop(), 0);
}

// N and N+1: a uid's share held by busy connections (each with a reservation open)
// of two processes and the observer; one more from this uid finds nothing idle to
// displace and is refused, clearly; another user still gets in.
TEST_F(Admission, ConnectionsPerUidAtCapAndCapPlusOne) {
  start({"--attach-group", "nogroup"});
  Holder a(daemon_->socket_path(), limits::connections_per_process_max, Hold::reserved);
  Holder b(daemon_->socket_path(),
           limits::connections_per_uid_max - 1 - limits::connections_per_process_max,
           Hold::reserved);
  EXPECT_EQ(a.answered(), limits::connections_per_process_max);
  EXPECT_EQ(b.answered(), limits::connections_per_uid_max - 1 - limits::connections_per_process_max);
  EXPECT_EQ(connections(), limits::connections_per_uid_max);
  EXPECT_EQ(try_connect(daemon_->socket_path(), make_ns(0x1, 16, 4096)), KVPARK_LIMIT_EXCEEDED);
  EXPECT_EQ(displaced(), 0u);
  observer_.publish_and_verify();
  if (geteuid() != 0) GTEST_SKIP() << "another user's connection needs root to set it up";
  open_socket_to_attach_group();
  Holder other(daemon_->socket_path(), 1, true, nobody_uid);
  EXPECT_EQ(other.answered(), 1u);
  EXPECT_EQ(daemon_->stop(), 0);
}

// libkvpark tries a refused connect again, backing off, for up to
// client::admission_retry_msec_max: a busy process that lets go of its connections
// meanwhile makes room, and the engine's connect succeeds instead of failing.
TEST_F(Admission, ARefusedConnectIsRetriedUntilASlotFrees) {
  start();
  Holder a(daemon_->socket_path(), limits::connections_per_process_max, Hold::reserved);
  auto b = std::make_unique<Holder>(
      daemon_->socket_path(),
      limits::connections_per_uid_max - 1 - limits::connections_per_process_max,
      Hold::reserved);
  ASSERT_EQ(connections(), limits::connections_per_uid_max);
  // Once the daemon has refused the engine's connect, b's process exits: its
  // connections close while libkvpark is still trying.
  std::thread release([&] {
    EXPECT_TRUE(wait_until(
        [&] { return read_file(daemon_->log_path()).find("refused pid") != std::string::npos; },
        10'000));
    b.reset();
  });
  EXPECT_EQ(try_connect(daemon_->socket_path(), make_ns(0x2, 16, 4096)), KVPARK_OK);
  release.join();
  EXPECT_EQ(daemon_->stop(), 0);
}

// Processes of one uid connecting and disconnecting in a loop, more than the uid's
// share at once: an engine of another process of that uid is admitted every time.
TEST_F(Admission, ChurnOfOneUidNeverLocksOutAnotherProcess) {
  start();
  std::vector<std::unique_ptr<Churner>> churners;
  for (int i = 0; i < churn_processes; ++i)
    churners.push_back(
        std::make_unique<Churner>(daemon_->socket_path(), churn_threads, churn_msec));
  // The churn has filled the uid's share once it displaces its own connections.
  EXPECT_TRUE(wait_until([&] { return displaced() > 0; }, churn_msec));
  const kvpark_namespace ns = make_ns(0xe9, 16, 4096);
  int admitted = 0;
  for (int attempt = 0; attempt < churn_engine_attempts; ++attempt)
    admitted += try_connect(daemon_->socket_path(), ns) == KVPARK_OK;
  uint64_t churn_connects = 0, churn_refused = 0;
  for (auto& churner : churners) {
    const auto [connects, refused] = churner->counts();
    churn_connects += connects;
    churn_refused += refused;
  }
  std::printf("churn of %d processes x %d threads: %llu connects, %llu refused; the engine "
              "admitted %d of %d; %llu connections displaced\n",
              churn_processes, churn_threads, static_cast<unsigned long long>(churn_connects),
              static_cast<unsigned long long>(churn_refused), admitted, churn_engine_attempts,
              static_cast<unsigned long long>(displaced()));
  EXPECT_EQ(admitted, churn_engine_attempts);
  EXPECT_GT(churn_refused + displaced(), 0u)
      << "the churn never reached the uid's cap: the test proved nothing";
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
