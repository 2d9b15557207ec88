#include "proxy/relay.h"

#include <httplib.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace kvpark::proxy {

Relay::Relay(const Upstream& upstream, std::string path, std::string body)
    : who_(upstream.describe()) {
  thread_ = std::thread([this, &upstream, path = std::move(path), body = std::move(body)] {
    const Reply reply = upstream.post_streaming(
        path, body,
        [this](int status, const std::string& content_type) {
          std::lock_guard lock(mutex_);
          status_ = status;
          content_type_ = content_type;
          changed_.notify_all();
          return !cancelled_;
        },
        [this](const char* data, size_t n) {
          std::lock_guard lock(mutex_);
          chunks_.emplace_back(data, n);
          changed_.notify_all();
          return !cancelled_;
        },
        &abort_);
    std::lock_guard lock(mutex_);
    if (status_ < 0) status_ = reply.status;
    error_ = reply.error;
    complete_ = reply.error.empty();  // post_streaming sets it whenever the exchange failed
    finished_ = true;
    changed_.notify_all();
  });
}

Relay::~Relay() {
  abandon();
  thread_.join();
}

int Relay::wait_status(std::string* ret_content_type) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return status_ >= 0 || finished_; });
  *ret_content_type = content_type_;
  return status_ < 0 ? 0 : status_;
}

std::string Relay::wait_body() {
  std::string body;
  std::string chunk;
  while (next_chunk(&chunk)) body += chunk;
  return body;
}

bool Relay::next_chunk(std::string* ret_chunk) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !chunks_.empty() || finished_; });
  if (chunks_.empty()) return false;
  *ret_chunk = std::move(chunks_.front());
  chunks_.pop_front();
  return true;
}

bool Relay::wait_unless(const std::function<bool()>& done,
                        const std::function<bool()>& client_gone) {
  std::unique_lock lock(mutex_);
  while (!changed_.wait_for(lock, client_watch_interval, done)) {
    lock.unlock();
    const bool gone = client_gone();
    lock.lock();
    if (gone && !done()) {
      lock.unlock();
      abandon();
      return false;
    }
  }
  return true;
}

bool Relay::wait_status_unless(const std::function<bool()>& client_gone) {
  return wait_unless([this] { return status_ >= 0 || finished_; }, client_gone);
}

bool Relay::wait_end_unless(const std::function<bool()>& client_gone) {
  return wait_unless([this] { return finished_; }, client_gone);
}

void Relay::cancel() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
}

void Relay::abandon() {
  cancel();
  abort_.abort();
}

const std::string& Relay::error() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return finished_; });
  return error_;
}

bool Relay::body_complete() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return finished_; });
  return complete_;
}

std::string Relay::failure() {
  return who_ + " broke off mid-response: " + error();
}

std::string EventSplitter::feed(const std::string& bytes) {
  pending_ += bytes;
  std::string out;
  for (;;) {
    // Events end with a blank line; llama-server writes "\n\n".
    const size_t end = pending_.find("\n\n");
    if (end == std::string::npos) break;
    out += rewrite_(pending_.substr(0, end + 2));
    pending_.erase(0, end + 2);
  }
  return out;
}

std::string EventSplitter::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

void stream_to_client(std::shared_ptr<Relay> relay, httplib::Response& res,
                      const std::string& content_type,
                      std::function<std::string(const std::string&, bool last)> transform,
                      std::function<void(StreamEnd end)> on_end) {
  auto end = std::make_shared<StreamEnd>(StreamEnd::client_gone);
  res.set_chunked_content_provider(
      content_type,
      [relay, transform, end](size_t, httplib::DataSink& sink) {
        std::string chunk;
        if (relay->next_chunk(&chunk)) {
          const std::string out = transform(chunk, false);
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            relay->cancel();  // the client went away: stop the generation
            return false;
          }
          return true;
        }
        if (!relay->body_complete()) {
          // Headers said 200 long ago, and a stream that merely stops reads as a
          // finished answer to most clients. So: an error event, which OpenAI's SDKs
          // raise as an APIError, then the connection closes without the last chunk
          // (returning false), which every HTTP client reports as a truncated
          // transfer. The part of an event held back by `transform` is dropped.
          *end = StreamEnd::upstream_failed;
          const std::string event =
              "data: " + error_body(502, "upstream_error", relay->failure()) + "\n\n";
          sink.write(event.data(), event.size());
          return false;
        }
        const std::string out = transform(std::string(), true);
        if (!out.empty()) sink.write(out.data(), out.size());
        *end = StreamEnd::completed;
        sink.done();
        return true;
      },
      // Runs once the response is written (or abandoned), so on_end's work (saving
      // and parking the slot) never delays the client.
      [relay, end, on_end](bool success) {
        relay->cancel();
        on_end(*end == StreamEnd::completed && !success ? StreamEnd::client_gone : *end);
      });
}

void send_then(httplib::Response& res, int status, std::string body,
               const std::string& content_type, std::function<void()> after) {
  res.status = status;
  auto shared = std::make_shared<std::string>(std::move(body));
  res.set_content_provider(
      shared->size(), content_type,
      [shared](size_t offset, size_t length, httplib::DataSink& sink) {
        return sink.write(shared->data() + offset, length);
      },
      [after](bool) { after(); });
}

std::string error_body(int status, const std::string& type, const std::string& message) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  w.StartObject();
  w.Key("error");
  w.StartObject();
  w.Key("message");
  w.String(message.c_str(), rapidjson::SizeType(message.size()));
  w.Key("type");
  w.String(type.c_str());
  w.Key("code");
  w.Int(status);
  w.EndObject();
  w.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

}  // namespace kvpark::proxy
