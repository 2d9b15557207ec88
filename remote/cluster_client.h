// A Redis-protocol client for one Redis or a Redis Cluster, with its own routing.
//
// Model: a set of nodes (the seeds and whatever CLUSTER SLOTS names), one blocking
// hiredis connection each, bounded by connect and socket timeouts. A cluster's map
// of 16384 hash slots to masters is read with CLUSTER SLOTS; a seed that answers
// "cluster support disabled" makes the client standalone (every key to that seed).
// execute() sends a batch of commands pipelined: grouped by node, every node's
// commands written before any reply is read, replies read in order. MOVED updates
// the slot map (and marks a refresh due), ASK sends ASKING and the command once to
// the named node; both are followed at most remote::redirects_max times. A node
// that cannot be reached, times out or breaks the stream is down: its commands in
// the batch answer Unavailable (a miss to the caller), and it is retried after a
// backoff that doubles up to retry_backoff_usec_max. Nothing here logs or throws.
// Not thread-safe: one thread (the daemon's remote worker) owns a client.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/status.h"

struct redisContext;
struct redisReply;

namespace kvpark::remote {

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  bool operator==(const Endpoint&) const = default;
};
// "redis://host:port[,host:port...]" (the scheme is optional; port defaults to 6379).
// InvalidArgument for an empty list, a bad port, or more than seeds_max seeds.
Status parse_endpoints(std::string_view text, std::vector<Endpoint>& ret_endpoints);

struct ClientOptions {
  std::vector<Endpoint> seeds;
  std::string user;      // ACL user; empty: AUTH with the password alone
  std::string password;  // empty: no AUTH
  uint32_t connect_timeout_msec = 0;  // 0: remote::connect_timeout_msec_default
  uint32_t io_timeout_msec = 0;       // 0: remote::io_timeout_msec_default
};

// One command; argv[1] is the key it is routed by. The views must outlive execute().
struct Command {
  std::vector<std::string_view> argv;
};

struct ReplyDeleter {
  void operator()(redisReply* reply) const;
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// Ok: the server answered (reply set; it may be nil, a string, an integer...).
// Rejected by the server with an error other than a redirection (e.g. OOM): IoError,
// with the text in `error`. No node could answer: Unavailable.
struct Reply {
  Status status = Status::Unavailable;
  ReplyPtr reply;
  std::string error;
  bool is_nil() const;
  bool is_string() const;
  std::string_view string() const;  // empty unless is_string()
  long long integer() const;        // 0 unless an integer reply
};

class ClusterClient {
 public:
  explicit ClusterClient(ClientOptions options);
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // Reads the slot map from the first node that answers (known masters first, then
  // seeds). Unavailable when none does.
  Status refresh();
  // Sends every command and fills ret_replies (same order, same size).
  void execute(std::span<const Command> commands, std::vector<Reply>& ret_replies);

  bool cluster_mode() const { return mode_ == Mode::Cluster; }
  bool topology_known() const { return mode_ != Mode::Unknown; }
  size_t nodes_known() const { return nodes_.size(); }
  size_t nodes_up() const;  // connected, or not yet tried
  size_t nodes_connected() const;
  uint64_t redirects() const { return redirects_; }
  uint64_t node_failures() const { return node_failures_; }
  uint64_t refreshes() const { return refreshes_; }
  // Slot owner as the client believes it, for tests: "host:port", or empty.
  std::string owner_of_slot(uint16_t slot) const;

 private:
  enum class Mode : uint8_t { Unknown, Standalone, Cluster };
  struct Node {
    Endpoint endpoint;
    redisContext* context = nullptr;
    uint64_t retry_at_usec = 0;  // CLOCK_MONOTONIC; down until then
    uint64_t backoff_usec = 0;
  };
  struct Pending {
    size_t command = 0;
    bool asking = false;
  };

  int node_index(const Endpoint& endpoint);  // adds it when new; -1 past nodes_max
  bool connect(Node& node);
  void fail(Node& node);
  Status refresh_from(Node& node);
  int route(std::string_view key) const;

  ClientOptions options_;
  Mode mode_ = Mode::Unknown;
  std::vector<Node> nodes_;
  std::vector<int16_t> slot_owner_;  // [hash_slots] node index, -1 unknown
  bool refresh_due_ = false;
  uint64_t refresh_after_usec_ = 0;  // failed refreshes back off too
  uint64_t redirects_ = 0;
  uint64_t node_failures_ = 0;
  uint64_t refreshes_ = 0;
};

}  // namespace kvpark::remote
