// The admission layer in front of cpp-httplib (see listener.h).
#include "http/listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace kvpark::http {
namespace {

// The text address and port of an IPv4 or IPv6 socket address ("" and 0 otherwise).
void address_of(const sockaddr_storage& addr, std::string& ret_ip, int& ret_port) {
  char text[INET6_ADDRSTRLEN] = {};
  ret_port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    ret_port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    ret_port = ntohs(in6->sin6_port);
  }
  ret_ip = text;
}

constexpr uint64_t listen_token = 0;
constexpr uint64_t wake_token = 1;
constexpr int listen_backlog = 128;
constexpr int epoll_wait_msec = 50;  // deadlines are honoured to this resolution
constexpr size_t receive_chunk_bytes = 16 * 1024;

uint64_t monotonic_usec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000 + uint64_t(ts.tv_nsec) / 1000;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// What the door says to a request it will not pass on.
void refuse(int fd, int status, const char* reason) {
  const std::string body = std::string("{\"error\": \"") + reason + "\"}\n";
  const std::string text = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                           "\r\nConnection: close\r\nContent-Type: application/json\r\n"
                           "Content-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// A buffered request for httplib: reads come from memory, writes go to the socket
// (waiting at most write_timeout_usec for room each time).
class BufferedStream : public httplib::Stream {
 public:
  BufferedStream(int fd, std::string request, const std::string& peer, int peer_port)
      : fd_(fd), request_(std::move(request)), peer_(peer), peer_port_(peer_port) {}
  bool is_readable() const override { return offset_ < request_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - offset_);
    std::memcpy(ptr, request_.data() + offset_, n);
    offset_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      const ssize_t n = send(fd_, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN) return -1;
      pollfd p{fd_, POLLOUT, 0};
      if (poll(&p, 1, static_cast<int>(limits::http_write_timeout_usec / 1000)) <= 0) return -1;
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = peer_;
    port = peer_port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ip.clear();
    port = 0;
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    address_of(addr, ip, port);
  }
  int socket() const override { return fd_; }

 private:
  int fd_;
  std::string request_;
  size_t offset_ = 0;
  std::string peer_;
  int peer_port_;
};

thread_local int serving_socket = -1;  // RouteServer::serve's connection, for client_hung_up

}  // namespace

bool RouteServer::serve(httplib::Stream& stream) {
  bool connection_closed = false;
  serving_socket = stream.socket();
  const bool ok = process_request(stream, false, connection_closed, nullptr);
  serving_socket = -1;
  return ok && !connection_closed;
}

bool client_hung_up() {
  if (serving_socket < 0) return false;
  pollfd p{serving_socket, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  // Readable: a next request's bytes, or the end of the stream.
  char byte = 0;
  const ssize_t n = recv(serving_socket, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

struct Listener::Impl {
  enum class Phase : uint8_t { Head, Body, Serving };
  struct Connection {
    int fd = -1;
    std::string peer;
    int peer_port = 0;
    std::string buffer;        // received, not yet handed to a worker
    uint64_t since_usec = 0;   // start of the current phase
    Phase phase = Phase::Head;
    size_t request_bytes = 0;  // head + body, once the head is parsed
  };
  struct Job {
    uint64_t id = 0;
    int fd = -1;
    std::string request;
    std::string peer;
    int peer_port = 0;
  };

  Impl(RouteServer& r, ListenerOptions o, ListenerCounters& c)
      : routes(r), options(std::move(o)), counters(c) {}

  RouteServer& routes;
  ListenerOptions options;
  ListenerCounters& counters;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::atomic<bool> stopping{false};
  std::thread thread;  // start()'s
  uint64_t next_id = 2;  // above the listen and wake tokens
  std::unordered_map<uint64_t, Connection> connections;
  std::unordered_map<std::string, size_t> per_peer;

  std::mutex mutex;  // guards jobs, returned, workers_stop
  std::condition_variable wake_workers;
  std::deque<Job> jobs;
  std::vector<std::pair<uint64_t, bool>> returned;  // id, keep alive
  bool workers_stop = false;
  std::vector<std::thread> workers;

  void close_connection(uint64_t id) {
    auto it = connections.find(id);
    if (it == connections.end()) return;
    if (it->second.phase != Phase::Serving) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, it->second.fd, nullptr);
    ::close(it->second.fd);
    if (--per_peer[it->second.peer] == 0) per_peer.erase(it->second.peer);
    connections.erase(it);
  }

  // The oldest connection still sending its head (of `peer`, or of anyone when empty).
  uint64_t oldest_in_head(const std::string* peer) const {
    uint64_t best = 0;
    uint64_t best_since = UINT64_MAX;
    for (const auto& [id, c] : connections) {
      if (c.phase != Phase::Head || (peer != nullptr && c.peer != *peer)) continue;
      if (c.since_usec < best_since) {
        best = id;
        best_since = c.since_usec;
      }
    }
    return best;
  }

  // Makes room under a cap by displacing the slowest sender; false when nobody can go.
  // A candidate is read first: a client whose whole request already waits in its
  // socket (one accepted in the same burst as the slow ones, say) is no slow sender
  // and goes on to a worker instead.
  bool make_room(const std::string* peer) {
    for (;;) {
      const uint64_t victim = oldest_in_head(peer);
      if (victim == 0) return false;
      on_readable(victim);
      const auto it = connections.find(victim);
      if (it == connections.end()) return true;  // it had closed, or was refused: room made
      if (it->second.phase != Phase::Head) continue;
      ++counters.displaced;
      close_connection(victim);
      return true;
    }
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or a transient error: epoll tells us again
      std::string peer;
      int port = 0;
      address_of(addr, peer, port);
      const bool room =
          (per_peer[peer] < options.connections_per_peer_max || make_room(&peer)) &&
          (connections.size() < options.connections_max || make_room(nullptr));
      if (!room) {
        if (per_peer[peer] == 0) per_peer.erase(peer);
        ++counters.refused;
        refuse(fd, 503, "Service Unavailable");
        ::close(fd);
        continue;
      }
      const uint64_t id = next_id++;
      ++per_peer[peer];
      connections.emplace(id, Connection{.fd = fd, .peer = peer, .peer_port = port,
                                         .since_usec = monotonic_usec()});
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = id;
      epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
    }
  }

  // Parses a complete head in c.buffer[0, head_end); false (and an answer sent) when
  // the request is refused at the door.
  bool admit_head(Connection& c, size_t head_end) {
    std::string head = c.buffer.substr(0, head_end);
    std::string kept;  // the head without Expect: we answer 100-continue ourselves
    uint64_t content_length = 0;
    bool expect_continue = false;
    size_t pos = head.find("\r\n") + 2;  // past the request line
    kept = head.substr(0, pos);
    while (pos < head.size()) {
      const size_t end = head.find("\r\n", pos);
      const std::string_view line(head.data() + pos, (end == std::string::npos ? head.size() : end) - pos);
      pos = end == std::string::npos ? head.size() : end + 2;
      const size_t colon = line.find(':');
      const std::string_view name = colon == std::string_view::npos ? line : line.substr(0, colon);
      const std::string_view value =
          colon == std::string_view::npos ? std::string_view() : trim(line.substr(colon + 1));
      if (iequals(name, "transfer-encoding")) {
        ++counters.refused;
        refuse(c.fd, 411, "Length Required");
        return false;
      }
      if (iequals(name, "expect")) {
        expect_continue = iequals(value, "100-continue");
        continue;
      }
      if (iequals(name, "content-length")) {
        uint64_t v = 0;
        const bool digits = !value.empty() && value.size() <= 19 &&
                            std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        if (digits) v = std::stoull(std::string(value));
        if (!digits) {
          ++counters.refused;
          refuse(c.fd, 400, "Bad Request");
          return false;
        }
        content_length = v;
      }
      kept.append(line.data(), line.size());
      kept += "\r\n";
    }
    if (content_length > options.body_bytes_max) {
      ++counters.refused;
      refuse(c.fd, 413, "Payload Too Large");
      return false;
    }
    c.buffer = kept + c.buffer.substr(head_end);
    c.request_bytes = kept.size() + content_length;
    c.phase = Phase::Body;
    c.since_usec = monotonic_usec();
    if (expect_continue && content_length > 0) {
      static constexpr char continue_line[] = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)send(c.fd, continue_line, sizeof continue_line - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    return true;
  }

  // Moves a connection as far as its buffer allows: head parsed, request handed over.
  void advance(uint64_t id) {
    Connection& c = connections.at(id);
    if (c.phase == Phase::Head) {
      const size_t end = c.buffer.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (c.buffer.size() > limits::http_head_bytes_max) {
          ++counters.refused;
          refuse(c.fd, 431, "Request Header Fields Too Large");
          close_connection(id);
        }
        return;
      }
      if (end + 4 > limits::http_head_bytes_max || !admit_head(c, end + 4)) {
        if (end + 4 > limits::http_head_bytes_max) {
          ++counters.refused;
          refuse(c.fd, 431, "Request Header Fields Too Large");
        }
        close_connection(id);
        return;
      }
    }
    if (c.phase != Phase::Body || c.buffer.size() < c.request_bytes) return;
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
    c.phase = Phase::Serving;
    Job job{.id = id, .fd = c.fd, .request = c.buffer.substr(0, c.request_bytes),
            .peer = c.peer, .peer_port = c.peer_port};
    c.buffer.erase(0, c.request_bytes);
    ++counters.requests;
    {
      std::lock_guard lock(mutex);
      jobs.push_back(std::move(job));
    }
    wake_workers.notify_one();
  }

  void on_readable(uint64_t id) {
    char chunk[receive_chunk_bytes];
    for (;;) {
      Connection& c = connections.at(id);
      const ssize_t n = recv(c.fd, chunk, sizeof chunk, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) break;
      if (n <= 0) {
        close_connection(id);
        return;
      }
      c.buffer.append(chunk, static_cast<size_t>(n));
      // Never hold more than one request's worth per connection.
      if (c.buffer.size() > limits::http_head_bytes_max + options.body_bytes_max) break;
    }
    advance(id);
  }

  void take_returned() {
    uint64_t count = 0;
    (void)!::read(wake_fd, &count, sizeof count);
    std::vector<std::pair<uint64_t, bool>> back;
    {
      std::lock_guard lock(mutex);
      back.swap(returned);
    }
    for (const auto& [id, keep] : back) {
      auto it = connections.find(id);
      if (it == connections.end()) continue;
      if (!keep || stopping) {
        close_connection(id);
        continue;
      }
      Connection& c = it->second;
      c.phase = Phase::Head;
      c.since_usec = monotonic_usec();
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = id;
      epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c.fd, &ev);
      advance(id);  // a pipelined request may be buffered already
    }
  }

  void expire(uint64_t now) {
    std::vector<uint64_t> late;
    for (const auto& [id, c] : connections) {
      if (c.phase == Phase::Head && now - c.since_usec >= options.head_timeout_usec) {
        ++counters.head_timeouts;
        late.push_back(id);
      } else if (c.phase == Phase::Body && now - c.since_usec >= options.body_timeout_usec) {
        ++counters.body_timeouts;
        late.push_back(id);
      }
    }
    for (uint64_t id : late) close_connection(id);
  }

  void work() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mutex);
        wake_workers.wait(lock, [this] { return workers_stop || !jobs.empty(); });
        if (workers_stop) return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      BufferedStream stream(job.fd, std::move(job.request), job.peer, job.peer_port);
      const bool keep = routes.serve(stream);
      {
        std::lock_guard lock(mutex);
        returned.emplace_back(job.id, keep);
      }
      const uint64_t one = 1;
      (void)!::write(wake_fd, &one, sizeof one);
    }
  }
};

Listener::Listener(RouteServer& routes, ListenerOptions options)
    : impl_(std::make_unique<Impl>(routes, std::move(options), counters_)) {}

Listener::~Listener() {
  stop();
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  if (impl_->epoll_fd >= 0) ::close(impl_->epoll_fd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

bool Listener::bind(std::string& ret_error) {
  Impl& m = *impl_;
  const std::string where = m.options.host + ":" + std::to_string(m.options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(m.options.host.empty() ? nullptr : m.options.host.c_str(),
                                 std::to_string(m.options.port).c_str(), &hints, &found);
      rc != 0) {
    ret_error = "cannot listen on " + where + ": " + gai_strerror(rc);
    return false;
  }
  int err = 0;
  for (addrinfo* a = found; a != nullptr && m.listen_fd < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    // SO_REUSEADDR lets a restart bind over TIME_WAIT; SO_REUSEPORT is never set, so
    // a port that is listened on already stays the other listener's.
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, listen_backlog) != 0) {
      err = errno;
      ::close(fd);
      continue;
    }
    m.listen_fd = fd;
  }
  freeaddrinfo(found);
  if (m.listen_fd < 0) {
    ret_error = "cannot listen on " + where + ": " + strerror(err);
    return false;
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(m.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  m.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  m.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m.epoll_fd < 0 || m.wake_fd < 0) {
    ret_error = std::string("cannot start the HTTP listener: ") + strerror(errno);
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = listen_token;
  epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, m.listen_fd, &ev);
  m.routes.set_listening_socket(m.listen_fd);
  ev.data.u64 = wake_token;
  epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, m.wake_fd, &ev);
  return true;
}

void Listener::run() {
  Impl& m = *impl_;
  for (size_t i = 0; i < std::max<size_t>(m.options.worker_threads, 1); ++i) {
    m.workers.emplace_back([&m] { m.work(); });
  }
  epoll_event events[64];
  while (!m.stopping) {
    const int n = epoll_wait(m.epoll_fd, events, 64, epoll_wait_msec);
    for (int i = 0; i < n; ++i) {
      const uint64_t token = events[i].data.u64;
      if (token == listen_token) {
        m.accept_all();
      } else if (token == wake_token) {
        m.take_returned();
      } else if (m.connections.contains(token) &&
                 m.connections.at(token).phase != Impl::Phase::Serving) {
        m.on_readable(token);
      }
    }
    m.expire(monotonic_usec());
  }
  m.routes.set_listening_socket(-1);  // streamed responses end
  {
    std::lock_guard lock(m.mutex);
    m.workers_stop = true;
  }
  m.wake_workers.notify_all();
  for (std::thread& t : m.workers) t.join();
  m.workers.clear();
  while (!m.connections.empty()) m.close_connection(m.connections.begin()->first);
  m.jobs.clear();
  m.returned.clear();
}

void Listener::start() {
  impl_->thread = std::thread([this] { run(); });
}

void Listener::stop() {
  impl_->stopping = true;
  if (impl_->wake_fd >= 0) {
    const uint64_t one = 1;
    (void)!::write(impl_->wake_fd, &one, sizeof one);
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace kvpark::http
