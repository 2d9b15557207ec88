#include "proxy/upstream.h"

#include <httplib.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <sys/socket.h>

#include "proxy/json.h"

namespace kvpark::proxy {
namespace {

constexpr time_t connect_timeout_sec = 3;
constexpr time_t read_timeout_sec = 3600;  // a long generation, or a long prefill

void configure(httplib::Client& client) {
  client.set_connection_timeout(connect_timeout_sec, 0);
  client.set_read_timeout(read_timeout_sec, 0);
  client.set_write_timeout(read_timeout_sec, 0);
}

Reply from_result(const httplib::Result& result) {
  Reply reply;
  if (!result) {
    reply.error = describe_http_error(int(result.error()));
    return reply;
  }
  reply.status = result->status;
  reply.body = result->body;
  reply.content_type = result->get_header_value("Content-Type");
  return reply;
}

std::string error_message(const Reply& reply) {
  if (reply.status == 0) return reply.error;
  rapidjson::Document doc;
  if (parse_json(reply.body, doc) == JsonStatus::ok && doc.IsObject() && doc.HasMember("error") &&
      doc["error"].IsObject() && doc["error"].HasMember("message") &&
      doc["error"]["message"].IsString())
    return "HTTP " + std::to_string(reply.status) + ": " + doc["error"]["message"].GetString();
  return "HTTP " + std::to_string(reply.status);
}

// A reply nested too deep to read is as bad as one that is not JSON.
bool parse_object(const Reply& reply, rapidjson::Document& doc) {
  return parse_json(reply.body, doc) == JsonStatus::ok && doc.IsObject();
}

uint32_t uint_member(const rapidjson::Value& v, const char* name) {
  if (!v.IsObject() || !v.HasMember(name)) return 0;
  const auto& m = v[name];
  return m.IsUint() ? m.GetUint() : 0;
}

bool slot_action(const Upstream& upstream, uint32_t slot_id, const char* action,
                 const std::string& file_name, uint32_t* ret_tokens, std::string* ret_error,
                 bool* ret_refused, int* ret_status) {
  rapidjson::StringBuffer body;
  rapidjson::Writer<rapidjson::StringBuffer> w(body);
  w.StartObject();
  w.Key("filename");
  w.String(file_name.c_str(), rapidjson::SizeType(file_name.size()));
  w.EndObject();
  const Reply reply = upstream.post(
      "/slots/" + std::to_string(slot_id) + "?action=" + action, body.GetString());
  if (ret_status != nullptr) *ret_status = reply.status;
  rapidjson::Document doc;
  if (!reply.ok() || !parse_object(reply, doc)) {
    *ret_error = error_message(reply);
    if (ret_refused != nullptr) *ret_refused = reply.status != 0;
    return false;
  }
  *ret_tokens = uint_member(doc, std::string(action) == "save" ? "n_saved" : "n_restored");
  return true;
}

}  // namespace

std::string describe_http_error(int httplib_error) {
  switch (httplib::Error(httplib_error)) {
    case httplib::Error::Connection: return "could not connect (connection refused: nothing listens there?)";
    case httplib::Error::ConnectionTimeout: return "connection timed out";
    case httplib::Error::Read: return "the connection closed before an answer";
    case httplib::Error::Write: return "the connection closed while sending";
    case httplib::Error::Canceled: return "cancelled";
    default: break;
  }
  return httplib::to_string(httplib::Error(httplib_error));
}

Reply Upstream::get(const std::string& path) const {
  httplib::Client client(options_.url);
  configure(client);
  return from_result(client.Get(path));
}

Reply Upstream::post(const std::string& path, const std::string& body,
                     const std::string& content_type) const {
  httplib::Client client(options_.url);
  configure(client);
  return from_result(client.Post(path, body, content_type));
}

void ExchangeAbort::abort() {
  aborted_.store(true);
  std::lock_guard lock(mutex_);
  // A connection being made sees aborted_ as its socket is set up; one made is in
  // flight by the time stop() gets the client's lock, and is shut down.
  if (client_ != nullptr) client_->stop();
}

Reply Upstream::post_streaming(const std::string& path, const std::string& body,
                               const std::function<bool(int, const std::string&)>& on_status,
                               const std::function<bool(const char*, size_t)>& on_chunk,
                               ExchangeAbort* abort) const {
  httplib::Client client(options_.url);
  configure(client);
  if (abort != nullptr) {
    std::lock_guard lock(abort->mutex_);
    if (abort->aborted_.load())
      return Reply{
          .status = 0, .body = {}, .content_type = {}, .error = "abandoned before it began"};
    abort->client_ = &client;
    client.set_socket_options([abort](int socket) {
      if (abort->aborted_.load()) shutdown(socket, SHUT_RDWR);
    });
  }
  struct Unregister {
    ExchangeAbort* abort;
    ~Unregister() {
      if (abort == nullptr) return;
      std::lock_guard lock(abort->mutex_);
      abort->client_ = nullptr;
    }
  } unregister{abort};
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.body = body;
  request.set_header("Content-Type", "application/json");
  request.response_handler = [&](const httplib::Response& response) {
    return on_status(response.status, response.get_header_value("Content-Type"));
  };
  request.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    return on_chunk(data, n);
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  Reply reply;
  if (!client.send(request, response, error)) {
    reply.error = describe_http_error(int(error));
    reply.status = response.status > 0 && error == httplib::Error::Canceled ? response.status : 0;
    return reply;
  }
  reply.status = response.status;
  reply.content_type = response.get_header_value("Content-Type");
  return reply;
}

bool Upstream::props(UpstreamProps* ret_props, std::string* ret_error) const {
  const Reply reply = get("/props");
  rapidjson::Document doc;
  if (!reply.ok() || !parse_object(reply, doc)) {
    *ret_error = error_message(reply);
    return false;
  }
  UpstreamProps p;
  if (doc.HasMember("model_path") && doc["model_path"].IsString())
    p.model_path = doc["model_path"].GetString();
  if (doc.HasMember("build_info") && doc["build_info"].IsString())
    p.build_info = doc["build_info"].GetString();
  p.total_slots = uint_member(doc, "total_slots");
  if (doc.HasMember("endpoint_slots") && doc["endpoint_slots"].IsBool())
    p.slots_endpoint = doc["endpoint_slots"].GetBool();
  if (p.model_path.empty() || p.total_slots == 0) {
    *ret_error = "GET /props names no model_path or no slots (is it llama-server?)";
    return false;
  }
  *ret_props = p;
  return true;
}

bool Upstream::slots(std::vector<SlotReport>* ret_slots, Reply* ret_reply) const {
  const Reply reply = get("/slots");
  if (ret_reply != nullptr) *ret_reply = reply;
  rapidjson::Document doc;
  if (!reply.ok() || parse_json(reply.body, doc) != JsonStatus::ok || !doc.IsArray()) return false;
  std::vector<SlotReport> slots;
  for (const auto& s : doc.GetArray()) {
    SlotReport r;
    r.known = s.IsObject() && s.HasMember("id_task");
    r.prompt_tokens = uint_member(s, "n_prompt_tokens");
    slots.push_back(r);
  }
  *ret_slots = std::move(slots);
  return true;
}

bool Upstream::chat_tokens(const std::string& request_body, std::vector<int32_t>* ret_tokens,
                           Reply* ret_failure) const {
  Reply rendered = post("/apply-template", request_body);
  rapidjson::Document doc;
  if (!rendered.ok() || !parse_object(rendered, doc) || !doc.HasMember("prompt") ||
      !doc["prompt"].IsString()) {
    *ret_failure = std::move(rendered);
    return false;
  }
  rapidjson::StringBuffer body;
  rapidjson::Writer<rapidjson::StringBuffer> w(body);
  w.StartObject();
  w.Key("content");
  w.String(doc["prompt"].GetString(), doc["prompt"].GetStringLength());
  w.Key("add_special");  // as the chat endpoint tokenizes its prompt
  w.Bool(true);
  w.Key("parse_special");
  w.Bool(true);
  w.EndObject();
  Reply tokenized = post("/tokenize", body.GetString());
  rapidjson::Document tokens;
  if (!tokenized.ok() || !parse_object(tokenized, tokens) || !tokens.HasMember("tokens") ||
      !tokens["tokens"].IsArray()) {
    *ret_failure = std::move(tokenized);
    return false;
  }
  ret_tokens->clear();
  for (const auto& t : tokens["tokens"].GetArray()) {
    if (!t.IsInt()) {
      ret_failure->status = 502;
      ret_failure->body = "/tokenize returned a non-integer token";
      return false;
    }
    ret_tokens->push_back(t.GetInt());
  }
  return true;
}

bool Upstream::tokenize(const std::string& text, std::vector<int32_t>* ret_tokens,
                        std::string* ret_error) const {
  rapidjson::StringBuffer body;
  rapidjson::Writer<rapidjson::StringBuffer> w(body);
  w.StartObject();
  w.Key("content");
  w.String(text.c_str(), rapidjson::SizeType(text.size()));
  w.Key("add_special");
  w.Bool(true);
  w.Key("parse_special");
  w.Bool(true);
  w.EndObject();
  const Reply reply = post("/tokenize", body.GetString());
  rapidjson::Document doc;
  if (!reply.ok() || !parse_object(reply, doc) || !doc.HasMember("tokens") ||
      !doc["tokens"].IsArray()) {
    *ret_error = "POST /tokenize: " + error_message(reply);
    return false;
  }
  ret_tokens->clear();
  for (const auto& t : doc["tokens"].GetArray())
    if (t.IsInt()) ret_tokens->push_back(t.GetInt());
  return true;
}

bool Upstream::prefill(uint32_t slot_id, const std::vector<int32_t>& tokens, size_t n_tokens,
                       uint32_t* ret_prefilled, double* ret_prefill_msec,
                       std::string* ret_error) const {
  rapidjson::StringBuffer body;
  rapidjson::Writer<rapidjson::StringBuffer> w(body);
  w.StartObject();
  w.Key("prompt");
  w.StartArray();
  for (size_t i = 0; i < n_tokens; ++i) w.Int(tokens[i]);
  w.EndArray();
  w.Key("n_predict");
  w.Int(0);
  w.Key("id_slot");
  w.Uint(slot_id);
  w.Key("cache_prompt");
  w.Bool(true);
  w.EndObject();
  const Reply reply = post("/completion", body.GetString());
  rapidjson::Document doc;
  if (!reply.ok() || !parse_object(reply, doc)) {
    *ret_error = error_message(reply);
    return false;
  }
  *ret_prefilled = doc.HasMember("timings") ? uint_member(doc["timings"], "prompt_n") : 0;
  *ret_prefill_msec = -1;
  if (doc.HasMember("timings") && doc["timings"].IsObject() &&
      doc["timings"].HasMember("prompt_ms") && doc["timings"]["prompt_ms"].IsNumber())
    *ret_prefill_msec = doc["timings"]["prompt_ms"].GetDouble();
  return true;
}

bool Upstream::save_slot(uint32_t slot_id, const std::string& file_name, uint32_t* ret_tokens,
                         std::string* ret_error, int* ret_status) const {
  return slot_action(*this, slot_id, "save", file_name, ret_tokens, ret_error, nullptr, ret_status);
}

bool Upstream::restore_slot(uint32_t slot_id, const std::string& file_name, uint32_t* ret_tokens,
                            std::string* ret_error, bool* ret_refused, int* ret_status) const {
  *ret_refused = false;
  return slot_action(*this, slot_id, "restore", file_name, ret_tokens, ret_error, ret_refused,
                     ret_status);
}

}  // namespace kvpark::proxy
