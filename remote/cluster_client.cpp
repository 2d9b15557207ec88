// Redis / Redis Cluster client over hiredis (see cluster_client.h).
#include "remote/cluster_client.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cassert>
#include <charconv>
#include <ctime>

#include "remote/remote_limits.h"
#include "remote/slot.h"

namespace kvpark::remote {
namespace {

uint64_t now_usec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

timeval to_timeval(uint32_t msec) {
  return timeval{.tv_sec = static_cast<time_t>(msec / 1000),
                 .tv_usec = static_cast<suseconds_t>((msec % 1000) * 1000)};
}

bool parse_port(std::string_view text, uint16_t& ret_port) {
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value == 0 || value > 65535) {
    return false;
  }
  ret_port = static_cast<uint16_t>(value);
  return true;
}

// "host:port", "[v6]:port" or a bare host (port 6379).
bool parse_endpoint(std::string_view text, Endpoint& ret) {
  Endpoint e;
  if (text.starts_with('[')) {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return false;
    e.host = std::string(text.substr(1, close - 1));
    const std::string_view rest = text.substr(close + 1);
    if (rest.empty()) {
      e.port = 6379;
    } else if (!rest.starts_with(':') || !parse_port(rest.substr(1), e.port)) {
      return false;
    }
    if (e.host.empty()) return false;
    ret = std::move(e);
    return true;
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    e.host = std::string(text);
    e.port = 6379;
  } else {
    e.host = std::string(text.substr(0, colon));
    if (!parse_port(text.substr(colon + 1), e.port)) return false;
  }
  if (e.host.empty()) return false;
  ret = std::move(e);
  return true;
}

std::string_view reply_text(const redisReply* r) {
  return r != nullptr ? std::string_view(r->str, r->len) : std::string_view();
}

}  // namespace

void ReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

bool Reply::is_nil() const { return reply && reply->type == REDIS_REPLY_NIL; }
bool Reply::is_string() const { return reply && reply->type == REDIS_REPLY_STRING; }
std::string_view Reply::string() const {
  return is_string() ? std::string_view(reply->str, reply->len) : std::string_view();
}
long long Reply::integer() const {
  return reply && reply->type == REDIS_REPLY_INTEGER ? reply->integer : 0;
}

Status parse_endpoints(std::string_view text, std::vector<Endpoint>& ret_endpoints) {
  constexpr std::string_view scheme = "redis://";
  if (text.starts_with(scheme)) text.remove_prefix(scheme.size());
  std::vector<Endpoint> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.starts_with(scheme)) item.remove_prefix(scheme.size());
    Endpoint e;
    if (!parse_endpoint(item, e)) return Status::InvalidArgument;
    out.push_back(std::move(e));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  if (out.empty() || out.size() > seeds_max) return Status::InvalidArgument;
  ret_endpoints = std::move(out);
  return Status::Ok;
}

ClusterClient::ClusterClient(ClientOptions options)
    : options_(std::move(options)), slot_owner_(hash_slots, -1) {
  nodes_.reserve(nodes_max);  // references to nodes stay valid while a batch adds one
  if (options_.connect_timeout_msec == 0) options_.connect_timeout_msec = connect_timeout_msec_default;
  if (options_.io_timeout_msec == 0) options_.io_timeout_msec = io_timeout_msec_default;
  for (const Endpoint& seed : options_.seeds) (void)node_index(seed);
}

ClusterClient::~ClusterClient() {
  for (Node& n : nodes_) {
    if (n.context != nullptr) redisFree(n.context);
  }
}

int ClusterClient::node_index(const Endpoint& endpoint) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].endpoint == endpoint) return static_cast<int>(i);
  }
  if (nodes_.size() >= nodes_max) return -1;
  nodes_.push_back(Node{.endpoint = endpoint});
  return static_cast<int>(nodes_.size() - 1);
}

size_t ClusterClient::nodes_up() const {
  const uint64_t now = now_usec();
  return static_cast<size_t>(std::count_if(nodes_.begin(), nodes_.end(), [&](const Node& n) {
    return n.context != nullptr || n.retry_at_usec <= now;
  }));
}

size_t ClusterClient::nodes_connected() const {
  return static_cast<size_t>(
      std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.context != nullptr; }));
}

std::string ClusterClient::owner_of_slot(uint16_t slot) const {
  const int owner = mode_ == Mode::Standalone ? 0 : slot_owner_.at(slot);
  if (owner < 0 || static_cast<size_t>(owner) >= nodes_.size()) return {};
  return nodes_[owner].endpoint.host + ":" + std::to_string(nodes_[owner].endpoint.port);
}

bool ClusterClient::connect(Node& node) {
  if (node.context != nullptr) return true;
  if (now_usec() < node.retry_at_usec) return false;  // backing off
  const timeval connect_tv = to_timeval(options_.connect_timeout_msec);
  redisContext* c = redisConnectWithTimeout(node.endpoint.host.c_str(), node.endpoint.port, connect_tv);
  if (c == nullptr || c->err != 0) {
    if (c != nullptr) redisFree(c);
    fail(node);
    return false;
  }
  const timeval io_tv = to_timeval(options_.io_timeout_msec);
  if (redisSetTimeout(c, io_tv) != REDIS_OK) {
    redisFree(c);
    fail(node);
    return false;
  }
  if (!options_.password.empty()) {
    redisReply* r = options_.user.empty()
                        ? static_cast<redisReply*>(redisCommand(c, "AUTH %b", options_.password.data(),
                                                                options_.password.size()))
                        : static_cast<redisReply*>(redisCommand(c, "AUTH %b %b", options_.user.data(),
                                                                options_.user.size(),
                                                                options_.password.data(),
                                                                options_.password.size()));
    const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
    if (r != nullptr) freeReplyObject(r);
    if (!ok) {
      redisFree(c);
      fail(node);
      return false;
    }
  }
  node.context = c;
  node.backoff_usec = 0;
  return true;
}

void ClusterClient::fail(Node& node) {
  if (node.context != nullptr) {
    redisFree(node.context);
    node.context = nullptr;
  }
  ++node_failures_;
  node.backoff_usec = node.backoff_usec == 0 ? retry_backoff_usec_min
                                             : std::min(node.backoff_usec * 2, retry_backoff_usec_max);
  node.retry_at_usec = now_usec() + node.backoff_usec;
  refresh_due_ = true;  // its slots may have moved (a failover) or it may be gone
}

Status ClusterClient::refresh_from(Node& node) {
  if (!connect(node)) return Status::Unavailable;
  auto* raw = static_cast<redisReply*>(redisCommand(node.context, "CLUSTER SLOTS"));
  if (raw == nullptr) {
    fail(node);
    return Status::Unavailable;
  }
  ReplyPtr r(raw);
  if (r->type == REDIS_REPLY_ERROR) {
    if (reply_text(r.get()).find("cluster support disabled") != std::string_view::npos) {
      // A plain Redis: every key lives on this node. Keep it first.
      const Endpoint self = node.endpoint;
      std::stable_partition(nodes_.begin(), nodes_.end(),
                            [&](const Node& n) { return n.endpoint == self; });
      mode_ = Mode::Standalone;
      return Status::Ok;
    }
    return Status::IoError;
  }
  if (r->type != REDIS_REPLY_ARRAY) return Status::IoError;
  std::vector<int16_t> owners(hash_slots, -1);
  const Endpoint asked = node.endpoint;  // nodes_ may grow below: no reference kept
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply* range = r->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
    const redisReply* first = range->element[0];
    const redisReply* last = range->element[1];
    const redisReply* master = range->element[2];
    if (first->type != REDIS_REPLY_INTEGER || last->type != REDIS_REPLY_INTEGER ||
        master->type != REDIS_REPLY_ARRAY || master->elements < 2 ||
        master->element[0]->type != REDIS_REPLY_STRING ||
        master->element[1]->type != REDIS_REPLY_INTEGER) {
      continue;
    }
    Endpoint e{.host = std::string(reply_text(master->element[0])),
               .port = static_cast<uint16_t>(master->element[1]->integer)};
    if (e.host.empty() || e.host == "?") e.host = asked.host;  // "the node you asked"
    const int index = node_index(e);
    if (index < 0) continue;
    for (long long s = std::max(first->integer, 0ll);
         s <= std::min<long long>(last->integer, hash_slots - 1); ++s) {
      owners[static_cast<size_t>(s)] = static_cast<int16_t>(index);
    }
  }
  slot_owner_ = std::move(owners);
  mode_ = Mode::Cluster;
  return Status::Ok;
}

Status ClusterClient::refresh() {
  ++refreshes_;
  refresh_due_ = false;
  // Masters the map names first (they are the likeliest to be up), then the seeds.
  std::vector<size_t> order;
  for (size_t i = 0; i < nodes_.size(); ++i) order.push_back(i);
  std::stable_partition(order.begin(), order.end(), [&](size_t i) {
    return nodes_[i].context != nullptr;
  });
  for (size_t i : order) {
    if (refresh_from(nodes_[i]) == Status::Ok) {
      refresh_after_usec_ = 0;
      return Status::Ok;
    }
  }
  refresh_due_ = true;
  refresh_after_usec_ = now_usec() + retry_backoff_usec_min;
  return Status::Unavailable;
}

int ClusterClient::route(std::string_view key) const {
  if (mode_ == Mode::Standalone) return nodes_.empty() ? -1 : 0;
  if (mode_ != Mode::Cluster) return -1;
  return slot_owner_[key_slot(key)];
}

void ClusterClient::execute(std::span<const Command> commands, std::vector<Reply>& ret_replies) {
  ret_replies.clear();
  ret_replies.resize(commands.size());
  if ((mode_ == Mode::Unknown || refresh_due_) && now_usec() >= refresh_after_usec_) {
    (void)refresh();
  }
  std::vector<std::vector<Pending>> queues(nodes_.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    assert(commands[i].argv.size() >= 2 && "every command names its key");
    const int node = route(commands[i].argv[1]);
    if (node >= 0) queues[static_cast<size_t>(node)].push_back({.command = i});
  }
  std::vector<const char*> argv;
  std::vector<size_t> argv_len;
  for (uint32_t round = 0; round <= redirects_max; ++round) {
    std::vector<std::vector<Pending>> next(nodes_.size());
    bool any = false;
    // Write every node's batch first, so the nodes work in parallel.
    std::vector<bool> sent(queues.size(), false);
    for (size_t n = 0; n < queues.size(); ++n) {
      if (queues[n].empty()) continue;
      Node& node = nodes_[n];
      if (!connect(node)) continue;
      for (const Pending& p : queues[n]) {
        if (p.asking) redisAppendCommand(node.context, "ASKING");
        const Command& c = commands[p.command];
        argv.clear();
        argv_len.clear();
        for (std::string_view a : c.argv) {
          argv.push_back(a.data());
          argv_len.push_back(a.size());
        }
        redisAppendCommandArgv(node.context, static_cast<int>(argv.size()), argv.data(),
                               argv_len.data());
      }
      int done = 0;
      while (done == 0) {
        if (redisBufferWrite(node.context, &done) != REDIS_OK) break;
      }
      if (done == 0) {
        fail(node);
        continue;
      }
      sent[n] = true;
    }
    for (size_t n = 0; n < queues.size(); ++n) {
      if (!sent[n]) continue;
      Node& node = nodes_[n];
      for (const Pending& p : queues[n]) {
        void* raw = nullptr;
        if (p.asking) {
          if (redisGetReply(node.context, &raw) != REDIS_OK) break;
          freeReplyObject(raw);
          raw = nullptr;
        }
        if (redisGetReply(node.context, &raw) != REDIS_OK || raw == nullptr) {
          fail(node);  // the rest of this node's batch stays Unavailable
          break;
        }
        ReplyPtr r(static_cast<redisReply*>(raw));
        Reply& out = ret_replies[p.command];
        if (r->type != REDIS_REPLY_ERROR) {
          out.status = Status::Ok;
          out.reply = std::move(r);
          continue;
        }
        const std::string_view text = reply_text(r.get());
        const bool moved = text.starts_with("MOVED ");
        const bool ask = text.starts_with("ASK ");
        if (moved || ask) {
          // "MOVED <slot> <host>:<port>"
          const size_t space = text.rfind(' ');
          Endpoint target;
          const int index = space != std::string_view::npos && parse_endpoint(text.substr(space + 1), target)
                                ? node_index(target)
                                : -1;
          ++redirects_;
          if (index >= 0) {
            if (moved) {
              slot_owner_[key_slot(commands[p.command].argv[1])] = static_cast<int16_t>(index);
              refresh_due_ = true;  // more slots probably moved with it
            }
            if (static_cast<size_t>(index) >= next.size()) next.resize(nodes_.size());
            next[static_cast<size_t>(index)].push_back({.command = p.command, .asking = ask});
            any = true;
            continue;
          }
        }
        // TRYAGAIN, CLUSTERDOWN, OOM, WRONGTYPE...: the server said no.
        out.status = Status::IoError;
        out.error = std::string(text);
      }
    }
    if (!any) break;
    queues = std::move(next);
  }
}

}  // namespace kvpark::remote
