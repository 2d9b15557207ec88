// OpenAI-style HTTP client for tests (see openai_http.h). RapidJSON and httplib
// errors stay here: a failed call returns status 0 or an unparsed result.
#include "tests/testing/openai_http.h"

#include <httplib.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <sstream>

namespace kvpark::testing {
namespace {

using Clock = std::chrono::steady_clock;

double msec_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void set_timeouts(httplib::Client* client, int timeout_msec) {
  const time_t sec = timeout_msec / 1000;
  const time_t usec = (timeout_msec % 1000) * 1000;
  client->set_connection_timeout(std::min<time_t>(sec, 5), usec);
  client->set_read_timeout(sec, usec);
  client->set_write_timeout(sec, usec);
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void copy_headers(const httplib::Headers& from, std::map<std::string, std::string>* to) {
  for (const auto& [name, value] : from) (*to)[lower(name)] = value;
}

const rapidjson::Value* member(const rapidjson::Value& v, const char* name) {
  if (!v.IsObject()) return nullptr;
  auto it = v.FindMember(name);
  return it == v.MemberEnd() ? nullptr : &it->value;
}

int64_t int_member(const rapidjson::Value& v, const char* name) {
  const rapidjson::Value* m = member(v, name);
  if (m == nullptr || !m->IsNumber()) return -1;
  return m->IsInt64() ? m->GetInt64() : int64_t(m->GetDouble());
}

std::string string_member(const rapidjson::Value& v, const char* name) {
  const rapidjson::Value* m = member(v, name);
  return m != nullptr && m->IsString() ? std::string(m->GetString(), m->GetStringLength()) : "";
}

// usage and timings, from a whole response or a final stream event.
void read_counts(const rapidjson::Value& doc, ChatResult* ret) {
  if (const rapidjson::Value* usage = member(doc, "usage"); usage != nullptr) {
    ret->prompt_tokens = int_member(*usage, "prompt_tokens");
    if (const rapidjson::Value* d = member(*usage, "prompt_tokens_details"); d != nullptr)
      ret->cached_tokens = int_member(*d, "cached_tokens");
  }
  if (const rapidjson::Value* timings = member(doc, "timings"); timings != nullptr) {
    ret->prompt_n = int_member(*timings, "prompt_n");
    ret->cache_n = int_member(*timings, "cache_n");
  }
}

const rapidjson::Value* first_choice(const rapidjson::Value& doc) {
  const rapidjson::Value* choices = member(doc, "choices");
  if (choices == nullptr || !choices->IsArray() || choices->Empty()) return nullptr;
  return &(*choices)[0];
}

// One "data:" payload of a chat stream.
void read_event(const std::string& payload, Clock::time_point start, ChatResult* ret) {
  if (ret->first_chunk_msec < 0) ret->first_chunk_msec = msec_since(start);
  if (payload == "[DONE]") return;
  rapidjson::Document doc;
  doc.Parse(payload.c_str(), payload.size());
  if (doc.HasParseError() || !doc.IsObject()) return;
  ret->parsed = true;
  if (const rapidjson::Value* choice = first_choice(doc); choice != nullptr) {
    if (const rapidjson::Value* delta = member(*choice, "delta"); delta != nullptr) {
      const std::string piece = string_member(*delta, "content");
      if (!piece.empty() && ret->first_content_msec < 0)
        ret->first_content_msec = msec_since(start);
      ret->content += piece;
    }
    const std::string finish = string_member(*choice, "finish_reason");
    if (!finish.empty()) ret->finish_reason = finish;
  }
  if (member(doc, "usage") != nullptr || member(doc, "timings") != nullptr) {
    ChatResult counts;
    read_counts(doc, &counts);
    if (counts.prompt_tokens >= 0) ret->prompt_tokens = counts.prompt_tokens;
    if (counts.cached_tokens >= 0) ret->cached_tokens = counts.cached_tokens;
    if (counts.prompt_n >= 0) ret->prompt_n = counts.prompt_n;
    if (counts.cache_n >= 0) ret->cache_n = counts.cache_n;
  }
}

// Consumes the complete events at the front of `pending`.
void drain_events(std::string* pending, Clock::time_point start, ChatResult* ret) {
  for (;;) {
    const size_t end = pending->find("\n\n");
    if (end == std::string::npos) return;
    std::istringstream event(pending->substr(0, end));
    pending->erase(0, end + 2);
    std::string line;
    while (std::getline(event, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) != 0) continue;
      size_t at = 5;
      while (at < line.size() && line[at] == ' ') ++at;
      read_event(line.substr(at), start, ret);
    }
  }
}

}  // namespace

std::string HttpResult::header(const std::string& name_lower) const {
  auto it = headers.find(name_lower);
  return it == headers.end() ? "" : it->second;
}

int64_t ChatResult::header_int(const std::string& name_lower) const {
  const std::string v = http.header(name_lower);
  if (v.empty()) return -1;
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  return end != v.c_str() ? int64_t(n) : -1;
}

HttpResult http_get(const std::string& base_url, const std::string& path, int timeout_msec) {
  httplib::Client client(base_url);
  set_timeouts(&client, timeout_msec);
  HttpResult ret;
  if (auto res = client.Get(path.c_str())) {
    ret.status = res->status;
    ret.body = res->body;
    copy_headers(res->headers, &ret.headers);
  }
  return ret;
}

HttpResult http_post(const std::string& base_url, const std::string& path, const std::string& body,
                     const std::string& content_type, int timeout_msec) {
  httplib::Client client(base_url);
  set_timeouts(&client, timeout_msec);
  HttpResult ret;
  if (auto res = client.Post(path.c_str(), body, content_type.c_str())) {
    ret.status = res->status;
    ret.body = res->body;
    copy_headers(res->headers, &ret.headers);
  }
  return ret;
}

std::string chat_request_json(const ChatRequest& request) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  w.StartObject();
  if (!request.model.empty()) {
    w.Key("model");
    w.String(request.model.c_str());
  }
  w.Key("messages");
  w.StartArray();
  for (const ChatMessage& m : request.messages) {
    w.StartObject();
    w.Key("role");
    w.String(m.role.c_str());
    w.Key("content");
    w.String(m.content.c_str(), rapidjson::SizeType(m.content.size()));
    w.EndObject();
  }
  w.EndArray();
  w.Key("temperature");
  w.Double(0.0);
  w.Key("seed");
  w.Int(42);
  w.Key("max_tokens");
  w.Int(request.max_tokens);
  w.Key("stream");
  w.Bool(request.stream);
  if (request.logprobs) {
    w.Key("logprobs");
    w.Bool(true);
  }
  if (request.stream) {
    w.Key("stream_options");
    w.StartObject();
    w.Key("include_usage");
    w.Bool(true);
    w.EndObject();
  }
  if (!request.cache_prompt) {
    w.Key("cache_prompt");
    w.Bool(false);
  }
  w.EndObject();
  return buffer.GetString();
}

ChatResult post_chat(const std::string& base_url, const ChatRequest& request, int timeout_msec) {
  const std::string body = chat_request_json(request);
  ChatResult ret;
  const Clock::time_point start = Clock::now();
  if (!request.stream) {
    ret.http = http_post(base_url, "/v1/chat/completions", body, "application/json", timeout_msec);
    ret.total_msec = msec_since(start);
    rapidjson::Document doc;
    doc.Parse(ret.http.body.c_str(), ret.http.body.size());
    if (ret.http.status == 0 || doc.HasParseError() || !doc.IsObject()) return ret;
    if (const rapidjson::Value* choice = first_choice(doc); choice != nullptr) {
      ret.parsed = true;
      if (const rapidjson::Value* message = member(*choice, "message"); message != nullptr)
        ret.content = string_member(*message, "content");
      ret.finish_reason = string_member(*choice, "finish_reason");
    }
    read_counts(doc, &ret);
    return ret;
  }

  std::string pending;
  ret.http = http_post_streamed(
      base_url, "/v1/chat/completions", body,
      [&](const char* data, size_t length) {
        pending.append(data, length);
        drain_events(&pending, start, &ret);
      },
      timeout_msec);
  pending += "\n\n";
  drain_events(&pending, start, &ret);
  ret.total_msec = msec_since(start);
  return ret;
}

HttpResult http_post_streamed(const std::string& base_url, const std::string& path,
                              const std::string& body,
                              const std::function<void(const char*, size_t)>& on_piece,
                              int timeout_msec) {
  HttpResult ret;
  httplib::Client client(base_url);
  set_timeouts(&client, timeout_msec);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
  req.body = body;
  req.response_handler = [&](const httplib::Response& response) {
    ret.status = response.status;
    copy_headers(response.headers, &ret.headers);
    return true;
  };
  req.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
    ret.body.append(data, length);
    on_piece(data, length);
    return true;
  };
  if (!client.send(req)) ret.status = 0;
  return ret;
}

int64_t prompt_tokens_total(const std::string& llama_server_url) {
  const HttpResult r = http_get(llama_server_url, "/metrics", 10'000);
  if (r.status != 200) return -1;
  std::istringstream lines(r.body);
  std::string line;
  const std::string key = "llamacpp:prompt_tokens_total";
  while (std::getline(lines, line)) {
    if (line.rfind(key, 0) != 0 || line.size() <= key.size() || line[key.size()] != ' ') continue;
    return int64_t(std::strtod(line.c_str() + key.size(), nullptr));
  }
  return -1;
}

bool tokenize(const std::string& llama_server_url, const std::string& text, bool special,
              std::vector<int32_t>* ret_tokens) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  w.StartObject();
  w.Key("content");
  w.String(text.c_str(), rapidjson::SizeType(text.size()));
  w.Key("add_special");
  w.Bool(special);
  w.Key("parse_special");
  w.Bool(special);
  w.EndObject();
  const HttpResult r = http_post(llama_server_url, "/tokenize", buffer.GetString());
  if (r.status != 200) return false;
  rapidjson::Document doc;
  doc.Parse(r.body.c_str(), r.body.size());
  if (doc.HasParseError()) return false;
  const rapidjson::Value* tokens = member(doc, "tokens");
  if (tokens == nullptr || !tokens->IsArray()) return false;
  ret_tokens->clear();
  for (const auto& t : tokens->GetArray()) {
    if (!t.IsInt()) return false;
    ret_tokens->push_back(t.GetInt());
  }
  return true;
}

int64_t count_tokens(const std::string& llama_server_url, const std::string& text) {
  std::vector<int32_t> tokens;
  return tokenize(llama_server_url, text, false, &tokens) ? int64_t(tokens.size()) : -1;
}

ProxyStatus get_proxy_status(const std::string& proxy_url) {
  ProxyStatus ret;
  const HttpResult r = http_get(proxy_url, "/kvpark/status", 10'000);
  ret.body = r.body;
  if (r.status != 200) return ret;
  rapidjson::Document doc;
  doc.Parse(r.body.c_str(), r.body.size());
  if (doc.HasParseError() || !doc.IsObject()) return ret;
  const rapidjson::Value* connected = member(doc, "kvparkd_connected");
  ret.parsed = connected != nullptr && connected->IsBool();
  ret.kvparkd_connected = ret.parsed && connected->GetBool();
  ret.requests = int_member(doc, "requests");
  ret.uncached_requests = int_member(doc, "uncached_requests");
  ret.head_prefills = int_member(doc, "head_prefills");
  ret.head_waits = int_member(doc, "head_waits");
  ret.restores = int_member(doc, "restores");
  ret.restore_failures = int_member(doc, "restore_failures");
  ret.publishes = int_member(doc, "publishes");
  ret.abandoned = int_member(doc, "abandoned");
  if (const rapidjson::Value* ups = member(doc, "upstreams"); ups != nullptr && ups->IsArray()) {
    for (const rapidjson::Value& u : ups->GetArray()) {
      ret.upstreams.push_back({.name = string_member(u, "name"),
                               .url = string_member(u, "url"),
                               .space = string_member(u, "namespace"),
                               .memory = string_member(u, "memory"),
                               .parking = string_member(u, "parking"),
                               .block_tokens = int_member(u, "block_tokens"),
                               .block_bytes = int_member(u, "block_bytes"),
                               .slots = int_member(u, "slots"),
                               .busy_slots = int_member(u, "busy_slots"),
                               .restores_discarded = u.HasMember("restores_discarded") &&
                                                     u["restores_discarded"].IsBool() &&
                                                     u["restores_discarded"].GetBool()});
    }
  }
  return ret;
}

ErrorBody parse_error_body(const std::string& body) {
  ErrorBody ret;
  rapidjson::Document doc;
  doc.Parse(body.c_str(), body.size());
  if (doc.HasParseError()) return ret;
  const rapidjson::Value* error = member(doc, "error");
  if (error == nullptr || !error->IsObject()) return ret;
  ret.parsed = true;
  ret.message = string_member(*error, "message");
  ret.type = string_member(*error, "type");
  ret.code = int_member(*error, "code");
  return ret;
}

std::string english_text(size_t words, uint64_t seed) {
  // Mostly the test model's own word pieces; a few other words for variety.
  static const char* const single[] = {" the", " a",    " of",    " and",   " to",   " in",
                                       " is",  " park", " cache", " state", " token"};
  static const char* const longer[] = {" parked", " states", " tokens", " reader", " eaten",
                                       " rain",   " heat",   " ocean",  " tin",    " rest"};
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::string out = "The";
  for (size_t i = 1; i < words; ++i) {
    const uint64_t r = next();
    if (r % 10 < 8)
      out += single[(r >> 8) % std::size(single)];
    else
      out += longer[(r >> 8) % std::size(longer)];
    if ((r >> 32) % 13 == 0) out += ".";
  }
  out += ".";
  return out;
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double max_of(const std::vector<double>& values) {
  return *std::max_element(values.begin(), values.end());
}

}  // namespace kvpark::testing
