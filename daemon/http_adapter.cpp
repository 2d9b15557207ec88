// HTTP routes over Control (see http_adapter.h).
#include "daemon/http_adapter.h"

#include <httplib.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <variant>

#include "daemon/status_fields.h"
#include "http/listener.h"
#include "http/process_metrics.h"
#include "proto/json_schema.h"
#include "proto/limits.h"
#include "proto/names.h"

namespace kvpark::daemon {
namespace {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

constexpr const char* metrics_content_type = "text/plain; version=0.0.4; charset=utf-8";
constexpr const char* json_content_type = "application/json";

bool parse_count(const std::string& text, uint64_t& ret_value) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return false;
  ret_value = value;
  return true;
}

void json_error(httplib::Response& res, int status, const std::string& message) {
  rapidjson::StringBuffer buffer;
  JsonWriter w(buffer);
  w.StartObject();
  w.Key("error");
  w.String(message.c_str());
  w.EndObject();
  res.status = status;
  res.set_content(std::string(buffer.GetString()) + "\n", json_content_type);
}

void send_json(httplib::Response& res, const rapidjson::StringBuffer& buffer) {
  res.status = 200;
  res.set_content(std::string(buffer.GetString()) + "\n", json_content_type);
}

// Microseconds as exact decimal seconds ("0.00005", "2.5", "10"): no exponent, no rounding.
std::string seconds_text(uint64_t usec) {
  std::string text = std::to_string(usec / 1'000'000);
  if (const uint64_t fraction = usec % 1'000'000; fraction != 0) {
    char digits[8];
    snprintf(digits, sizeof digits, "%06llu", static_cast<unsigned long long>(fraction));
    std::string f = digits;
    f.erase(f.find_last_not_of('0') + 1);
    text += "." + f;
  }
  return text;
}

// One Prometheus family: HELP and TYPE, then its samples.
class MetricsText {
 public:
  void family(const char* name, const char* type, const char* help) {
    name_ = name;
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(uint64_t value, const std::string& labels = "") {
    out_ += name_ + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(value) + "\n";
  }
  void sample_double(double value) {
    char text[64];
    snprintf(text, sizeof text, "%.6f", value);
    out_ += name_ + " " + text + "\n";
  }
  // A histogram family: cumulative _bucket samples (microsecond bounds shown as exact
  // decimal seconds), then _sum and _count.
  template <const auto& Bounds>
  void histogram(const char* name, const char* help, const LatencyHistogram<Bounds>& h) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    for (size_t i = 0; i < h.bounded_buckets; ++i) {
      out_ += std::string(name) + "_bucket{le=\"" + seconds_text(Bounds[i]) + "\"} " +
              std::to_string(h.cumulative(i)) + "\n";
    }
    out_ += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(h.count) + "\n";
    out_ += std::string(name) + "_sum " + seconds_text(h.sum_usec) + "\n";
    out_ += std::string(name) + "_count " + std::to_string(h.count) + "\n";
  }
  void one(const char* name, const char* type, const char* help, uint64_t value) {
    family(name, type, help);
    sample(value);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string name_;
  std::string out_;
};

std::string label(const char* key, const std::string& value) {
  return std::string(key) + "=\"" + value + "\"";  // values here never need escaping
}

// Every status field under its key (status_fields.h), then the histograms' figures.
void write_status(JsonWriter& w, const StatusInfo& s) {
  w.StartObject();
  for (const StatusField& f : status_fields()) {
    w.Key(f.key);
    if (f.unit == StatusUnit::id) {
      w.String(hex64(status_number(s, f)).c_str());
    } else if (auto* text = std::get_if<std::string StatusInfo::*>(&f.member)) {
      w.String((s.**text).c_str());
    } else if (auto* flag = std::get_if<bool StatusInfo::*>(&f.member)) {
      w.Bool(s.**flag);
    } else {
      w.Uint64(status_number(s, f));
    }
  }
  for (const auto& [key, value] : status_histogram_figures(s)) {
    w.Key(key.c_str());
    w.Uint64(value);
  }
  w.EndObject();
}

void write_namespace(JsonWriter& w, const NamespaceSummary& n) {
  w.StartObject();
  w.Key("id");
  w.String(hex128(n.id).c_str());
  w.Key("block_tokens");
  w.Uint(n.geometry.block_tokens);
  w.Key("block_payload_bytes");
  w.Uint64(n.geometry.block_payload_bytes);
  w.Key("snapshot_required");
  w.Bool(n.geometry.snapshot_required);
  w.Key("chain_tokens");
  w.Uint(n.chain_tokens);
  w.Key("prefill_tokens_per_second");
  w.Uint(n.prefill_tokens_per_second);
  w.Key("blocks");
  w.Uint64(n.blocks);
  w.Key("snapshots");
  w.Uint64(n.snapshots);
  w.Key("host_bytes");
  w.Uint64(n.host_bytes);
  w.Key("disk_bytes");
  w.Uint64(n.disk_bytes);
  w.Key("restorable_tokens");
  w.Uint64(n.restorable_tokens);
  w.Key("restored_tokens");
  w.Uint64(n.restored_tokens);
  w.EndObject();
}

void write_entry(JsonWriter& w, const EntrySummary& e) {
  w.StartObject();
  w.Key(json_schema::entry_id);
  w.String(std::to_string(e.id).c_str());
  w.Key("namespace");
  w.String(hex128(e.namespace_id).c_str());
  w.Key("kind");
  w.String(entry_kind_name(e.kind));
  w.Key("tier");
  w.String(tier_name(e.tier));
  w.Key(json_schema::key_hash);
  w.String(hex128(e.key_hash).c_str());
  w.Key("position");
  w.Uint(e.position);
  w.Key("tail_tokens");
  w.Uint(e.tail_tokens);
  w.Key("bytes");
  w.Uint64(e.bytes);
  w.Key("class");
  w.String(entry_class_name(e.entry_class));
  w.Key("evidence");
  w.String(evidence_name(e.evidence));
  w.Key("hits");
  w.Uint64(e.hits);
  w.Key("idle_usec");
  w.Uint64(e.idle_usec);
  w.Key(json_schema::creator_session);
  w.String(std::to_string(e.creator_session).c_str());
  w.Key("leases");
  w.Uint(e.leases);
  w.Key("pinned");
  w.Bool(e.pinned);
  w.EndObject();
}

// Reads /v1/entries' query into a filter; false with the message for a 400.
bool parse_entry_filter(const httplib::Request& req, EntryFilter& ret_filter,
                        std::string& ret_error) {
  EntryFilter filter;
  filter.limit = http_entries_limit_default;
  for (const auto& [key, value] : req.params) {
    if (req.params.count(key) > 1) {
      ret_error = "query parameter '" + key + "' given more than once";
      return false;
    }
    if (key == "namespace") {
      Hash128 id;
      if (!parse_hex128(value, id)) {
        ret_error = "namespace must be up to 32 hex digits";
        return false;
      }
      filter.namespace_id = id;
    } else if (key == "tier") {
      Tier tier;
      if (!parse_tier(value, tier) || tier == Tier::Both) {
        ret_error = "tier must be host or disk";
        return false;
      }
      filter.tier = tier;
    } else if (key == "class") {
      EntryClass entry_class;
      if (!parse_entry_class(value, entry_class)) {
        ret_error = "class must be shared or private";
        return false;
      }
      filter.entry_class = entry_class;
    } else if (key == "offset") {
      if (!parse_count(value, filter.offset)) {
        ret_error = "offset must be a non-negative integer";
        return false;
      }
    } else if (key == "limit") {
      if (!parse_count(value, filter.limit) || filter.limit == 0 ||
          filter.limit > http_entries_limit_max) {
        ret_error = "limit must be an integer from 1 to " + std::to_string(http_entries_limit_max);
        return false;
      }
    } else {
      ret_error = "unknown query parameter '" + key + "'";
      return false;
    }
  }
  ret_filter = filter;
  return true;
}

}  // namespace

std::string render_metrics(const StatusInfo& s, const std::vector<NamespaceSummary>& spaces) {
  MetricsText m;
  m.family("kvpark_build_info", "gauge", "Version of the running kvparkd (always 1).");
  m.sample(1, label("version", s.version));
  m.family("kvpark_arena_page_bytes", "gauge",
           "Page size backing the host arena, by kind (hugetlb, thp, 4k).");
  m.sample(s.arena_page_bytes, label("pages", s.arena_pages));

  // Every field with a metric (status_fields.h); a family's samples together, families in
  // the order they first appear.
  auto shown = [&](const StatusField& f) {
    return f.metric.metric != nullptr && (s.remote_enabled || !f.remote_only);
  };
  std::vector<std::string> families;
  for (const StatusField& f : status_fields()) {
    if (shown(f) && std::find(families.begin(), families.end(), f.metric.metric) == families.end())
      families.push_back(f.metric.metric);
  }
  for (const std::string& family : families) {
    bool first = true;
    for (const StatusField& f : status_fields()) {
      if (!shown(f) || family != f.metric.metric) continue;
      if (first) m.family(f.metric.metric, f.metric.type, f.metric.help);
      first = false;
      if (f.metric.seconds)
        m.sample_double(static_cast<double>(status_number(s, f)) / 1e6);
      else
        m.sample(status_number(s, f), f.metric.labels);
    }
  }
  for (const StatusHistogram& h : status_histograms()) {
    if (h.remote_only && !s.remote_enabled) continue;
    std::visit([&](auto member) { m.histogram(h.metric, h.help, s.*member); }, h.member);
  }

  m.family("kvpark_namespace_entries", "gauge", "Sealed entries per namespace, by kind.");
  for (const NamespaceSummary& n : spaces) {
    const std::string ns = label("namespace", hex128(n.id));
    m.sample(n.blocks, ns + "," + label("kind", entry_kind_name(EntryKind::Block)));
    m.sample(n.snapshots, ns + "," + label("kind", entry_kind_name(EntryKind::Snapshot)));
  }
  m.family("kvpark_namespace_bytes", "gauge", "Bytes per namespace, by tier.");
  for (const NamespaceSummary& n : spaces) {
    const std::string ns = label("namespace", hex128(n.id));
    m.sample(n.host_bytes, ns + "," + label("tier", tier_name(Tier::Host)));
    m.sample(n.disk_bytes, ns + "," + label("tier", tier_name(Tier::Disk)));
  }
  m.family("kvpark_namespace_restorable_tokens_total", "counter",
           "Tokens lookups found restorable, per namespace.");
  for (const NamespaceSummary& n : spaces)
    m.sample(n.restorable_tokens, label("namespace", hex128(n.id)));
  m.family("kvpark_namespace_restored_tokens_total", "counter",
           "Tokens clients restored, as they reported at release, per namespace.");
  for (const NamespaceSummary& n : spaces)
    m.sample(n.restored_tokens, label("namespace", hex128(n.id)));
  return m.take();
}

struct HttpAdapter::Impl {
  http::RouteServer server;
  std::unique_ptr<http::Listener> listener;
};

HttpAdapter::HttpAdapter(Control& control) : control_(control) {}

HttpAdapter::~HttpAdapter() {
  stop();
}

bool HttpAdapter::start(const std::string& host, uint16_t port, std::string& ret_error) {
  auto impl = std::make_unique<Impl>();
  http::RouteServer& server = impl->server;
  server.set_payload_max_length(limits::http_status_body_bytes_max);

  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const StatusInfo status = control_.status();
    res.set_content(render_metrics(status, control_.namespaces()) + http::process_metrics_text(),
                    metrics_content_type);
  });
  // 200 {"status":"ready"} or 503 {"status":STATE,"reasons":[...]} (control.h HealthInfo).
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const HealthInfo h = control_.health();
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    w.StartObject();
    w.Key("status");
    w.String(h.state.c_str());
    if (!h.reasons.empty()) {
      w.Key("reasons");
      w.StartArray();
      for (const std::string& reason : h.reasons) w.String(reason.c_str());
      w.EndArray();
    }
    w.EndObject();
    res.status = h.ready ? 200 : 503;
    res.set_content(std::string(buffer.GetString()) + "\n", json_content_type);
  });
  server.Get("/v1/status", [this](const httplib::Request&, httplib::Response& res) {
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    write_status(w, control_.status());
    send_json(res, buffer);
  });
  server.Get("/v1/namespaces", [this](const httplib::Request&, httplib::Response& res) {
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    w.StartObject();
    w.Key("namespaces");
    w.StartArray();
    for (const NamespaceSummary& n : control_.namespaces()) write_namespace(w, n);
    w.EndArray();
    w.EndObject();
    send_json(res, buffer);
  });
  server.Get("/v1/entries", [this](const httplib::Request& req, httplib::Response& res) {
    EntryFilter filter;
    std::string error;
    if (!parse_entry_filter(req, filter, error)) return json_error(res, 400, error);
    uint64_t total = 0;
    const std::vector<EntrySummary> page = control_.entries(filter, total);
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    w.StartObject();
    w.Key("total");
    w.Uint64(total);
    w.Key("offset");
    w.Uint64(filter.offset);
    w.Key("limit");
    w.Uint64(filter.limit);
    w.Key("entries");
    w.StartArray();
    for (const EntrySummary& e : page) write_entry(w, e);
    w.EndArray();
    w.EndObject();
    send_json(res, buffer);
  });
  server.Get(R"(/v1/entries/([0-9]+))", [this](const httplib::Request& req,
                                                httplib::Response& res) {
    uint64_t id = 0;
    if (!parse_count(req.matches[1].str(), id)) {
      return json_error(res, 400, "entry id must be a decimal number");
    }
    EntrySummary e;
    if (const Status s = control_.entry(id, e); s != Status::Ok) {
      return json_error(res, s == Status::NotFound ? 404 : 503,
                        "entry " + std::to_string(id) +
                            (s == Status::NotFound ? ": not found" : ": kvparkd is stopping"));
    }
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    write_entry(w, e);
    send_json(res, buffer);
  });
  const auto refuse = [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Allow", "GET, HEAD");
    json_error(res, 405, "method " + req.method + " not allowed; this API is read-only");
  };
  server.Post(".*", refuse);
  server.Put(".*", refuse);
  server.Patch(".*", refuse);
  server.Delete(".*", refuse);
  server.Options(".*", refuse);
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a route already wrote its error
    json_error(res, res.status,
               res.status == 404 ? "no such path: " + req.path : std::string("bad request"));
  });

  // Slow or oversized clients are held off in front of the workers (http/listener.h).
  impl->listener = std::make_unique<http::Listener>(
      server, http::ListenerOptions{.host = host,
                                    .port = port,
                                    .worker_threads = http_worker_threads,
                                    .body_bytes_max = limits::http_status_body_bytes_max});
  if (!impl->listener->bind(ret_error)) return false;
  port_ = impl->listener->port();
  impl->listener->start();
  impl_ = std::move(impl);
  return true;
}

void HttpAdapter::stop() {
  if (!impl_) return;
  impl_->listener->stop();
  impl_.reset();
}

}  // namespace kvpark::daemon
