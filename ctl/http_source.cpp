// kvparkctl's read verbs over kvparkd's HTTP status API (see source.h): GET
// /v1/status, /v1/namespaces, /v1/entries and /v1/entries/ID, whose documents are
// already in the JSON schema (proto/json_schema.h). httplib and RapidJSON stay here.
#include <httplib.h>
#include <rapidjson/document.h>

#include <string>

#include "ctl/failure.h"
#include "ctl/source.h"

namespace kvpark::ctl {
namespace {

constexpr time_t http_connect_timeout_sec = 2;  // loopback: refused or answered at once
constexpr time_t http_read_timeout_sec = 10;

std::string why_no_answer(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "cannot connect";
    case httplib::Error::ConnectionTimeout:
      return "connect timed out";
    case httplib::Error::Read:
      return "no reply";
    default:
      return httplib::to_string(e);
  }
}

Record record_of(const rapidjson::Value& object) {
  Record r;
  for (const auto& m : object.GetObject()) {
    const std::string key = m.name.GetString();
    if (m.value.IsString())
      r[key] = Value::of_text(m.value.GetString());
    else if (m.value.IsBool())
      r[key] = Value::of_flag(m.value.GetBool());
    else if (m.value.IsUint64())
      r[key] = Value::of_number(m.value.GetUint64());
  }
  return r;
}

class HttpSource final : public ReadSource {
 public:
  HttpSource(std::string host, int port, std::string address)
      : client_(host, port), address_(std::move(address)) {
    client_.set_connection_timeout(http_connect_timeout_sec, 0);
    client_.set_read_timeout(http_read_timeout_sec, 0);
  }

  Record status() override {
    rapidjson::Document doc = get("/v1/status");
    return record_of(doc);
  }
  std::vector<Record> namespaces() override {
    rapidjson::Document doc = get("/v1/namespaces");
    std::vector<Record> out;
    if (!doc.HasMember("namespaces") || !doc["namespaces"].IsArray()) malformed("/v1/namespaces");
    for (const auto& n : doc["namespaces"].GetArray()) {
      if (n.IsObject()) out.push_back(record_of(n));
    }
    return out;
  }
  EntryPage entries(const EntryQuery& q) override {
    std::string path =
        "/v1/entries?offset=" + std::to_string(q.offset) + "&limit=" + std::to_string(q.limit);
    if (!q.namespace_hex.empty()) path += "&namespace=" + q.namespace_hex;
    if (!q.tier.empty()) path += "&tier=" + q.tier;
    if (!q.entry_class.empty()) path += "&class=" + q.entry_class;
    rapidjson::Document doc = get(path);
    if (!doc.HasMember("entries") || !doc["entries"].IsArray() || !doc.HasMember("total") ||
        !doc["total"].IsUint64()) {
      malformed("/v1/entries");
    }
    EntryPage page;
    page.total = doc["total"].GetUint64();
    for (const auto& e : doc["entries"].GetArray()) {
      if (e.IsObject()) page.entries.push_back(record_of(e));
    }
    return page;
  }
  Record entry(uint64_t id) override {
    rapidjson::Document doc = get("/v1/entries/" + std::to_string(id));
    return record_of(doc);
  }
  const char* name() const override { return "HTTP"; }

 private:
  [[noreturn]] void malformed(const std::string& path) {
    fail(exit_failure, "http://" + address_ + path + ": not the document kvparkd serves");
  }

  // The JSON object at `path`; Unreachable when nothing answers, fail() on an
  // error status (404 is not found, 400 a bad query).
  rapidjson::Document get(const std::string& path) {
    httplib::Result res = client_.Get(path.c_str());
    if (!res) {
      throw Unreachable{"nothing answers HTTP at " + address_ + " (" + why_no_answer(res.error()) +
                        ")"};
    }
    rapidjson::Document doc;
    doc.Parse(res->body.c_str());
    const bool object = !doc.HasParseError() && doc.IsObject();
    if (res->status != 200) {
      const std::string why = object && doc.HasMember("error") && doc["error"].IsString()
                                  ? doc["error"].GetString()
                                  : "HTTP " + std::to_string(res->status);
      fail(res->status == 404   ? exit_not_found
           : res->status == 400 ? exit_usage
                                : exit_failure,
           why);
    }
    if (!object) malformed(path);
    return doc;
  }

  httplib::Client client_;
  std::string address_;
};

}  // namespace

std::unique_ptr<ReadSource> open_http_source(const std::string& address) {
  // "HOST:PORT" or "[V6]:PORT"; a wildcard listener is reached on loopback.
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  int port = 0;
  if (colon != std::string::npos) port = atoi(address.c_str() + colon + 1);
  if (port <= 0 || port > 65535)
    fail(exit_usage, "--http: expected HOST:PORT, got '" + address + "'");
  return std::make_unique<HttpSource>(host, port, address);
}

}  // namespace kvpark::ctl
