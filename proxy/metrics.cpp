// GET /metrics: the proxy's counters and its upstreams' state in the Prometheus text
// exposition format 0.0.4. Every family is declared (HELP, TYPE) before its samples;
// counters end in _total. Names: kvpark_proxy_*, then the standard process_* families
// (http/process_metrics.h).
#include <cstdio>
#include <iterator>
#include <string>

#include "http/process_metrics.h"
#include "proxy/proxy.h"

namespace kvpark::proxy {
namespace {

// Label values escaped as the format asks (backslash, quote, newline).
std::string escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

class Writer {
 public:
  void family(const char* name, const char* type, const char* help) {
    text_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, const std::string& labels, uint64_t value) {
    text_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(value) + "\n";
  }
  void sample_double(const std::string& name, const std::string& labels, double value) {
    char text[64];
    std::snprintf(text, sizeof text, "%.6f", value);
    text_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + text + "\n";
  }
  std::string take() { return std::move(text_); }

 private:
  std::string text_;
};

std::string format_seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

std::string upstream_labels(const Route& route) {
  return "upstream=\"" + escape(route.name()) + "\",url=\"" +
         escape(route.url()) + "\"";
}

}  // namespace

std::string metrics_text(ProxyState& proxy) {
  const Counters& c = proxy.counters;
  Writer w;
  w.family("kvpark_proxy_requests_total", "counter",
           "Chat requests answered 200, by how their prompt was had (reuse).");
  for (size_t k = 0; k < size_t(ReuseKind::count); ++k)
    w.sample("kvpark_proxy_requests_total",
             std::string("reuse=\"") + reuse_kind_string(ReuseKind(k)) + "\"", c.answered[k]);
  w.family("kvpark_proxy_prompt_tokens_total", "counter",
           "Prompt tokens of answered chat requests.");
  w.sample("kvpark_proxy_prompt_tokens_total", "", c.prompt_tokens);
  w.family("kvpark_proxy_prefilled_tokens_total", "counter",
           "Prompt tokens prefilled on behalf of answered requests (heads they led included).");
  w.sample("kvpark_proxy_prefilled_tokens_total", "", c.prefilled_tokens);
  w.family("kvpark_proxy_restored_tokens_total", "counter",
           "Prompt tokens restored from kvparkd into a slot for answered requests.");
  w.sample("kvpark_proxy_restored_tokens_total", "", c.restored_tokens);
  w.family("kvpark_proxy_cached_tokens_total", "counter",
           "Prompt tokens reported as cached_tokens (prompt tokens minus prefilled ones).");
  w.sample("kvpark_proxy_cached_tokens_total", "", c.cached_tokens);
  w.family("kvpark_proxy_uncached_requests_total", "counter",
           "Chat requests served without kvparkd or without a ready upstream.");
  w.sample("kvpark_proxy_uncached_requests_total", "", c.uncached_requests);
  w.family("kvpark_proxy_restores_total", "counter", "Parked states restored into a slot.");
  w.sample("kvpark_proxy_restores_total", "", c.restores);
  w.family("kvpark_proxy_restore_failures_total", "counter",
           "Parked states not restored (the request was prefilled instead), by cause.");
  for (size_t k = 0; k < size_t(RestoreFailure::count); ++k)
    w.sample("kvpark_proxy_restore_failures_total",
             std::string("cause=\"") + restore_failure_string(RestoreFailure(k)) + "\"",
             c.failures[k]);
  w.family("kvpark_proxy_head_prefills_total", "counter",
           "Heads prefilled alone and parked (one per head flight led).");
  w.sample("kvpark_proxy_head_prefills_total", "", c.head_prefills);
  w.family("kvpark_proxy_head_waits_total", "counter",
           "Times a request waited for a head another request was prefilling.");
  w.sample("kvpark_proxy_head_waits_total", "", c.head_waits);
  w.family("kvpark_proxy_forwarded_total", "counter",
           "Chat requests forwarded cached, by path: known_prefix (no upstream call before "
           "forwarding), full (rendered and tokenized first).");
  w.sample("kvpark_proxy_forwarded_total", "path=\"known_prefix\"", c.forwarded_fast);
  w.sample("kvpark_proxy_forwarded_total", "path=\"full\"", c.forwarded_full);
  w.family("kvpark_proxy_prefix_mismatches_total", "counter",
           "Requests forwarded on a known prefix that their full tokenization did not start "
           "with (a merge across the boundary): parked by the full one.");
  w.sample("kvpark_proxy_prefix_mismatches_total", "", c.prefix_mismatches);
  w.family("kvpark_proxy_forward_delay_seconds", "histogram",
           "Time in the proxy from a chat request's arrival to its forwarding upstream.");
  uint64_t cumulative = 0;
  for (size_t b = 0; b < Counters::forward_delay_buckets; ++b) {
    cumulative += c.forward_delay_counts[b];
    const std::string le = b < std::size(Counters::forward_delay_bounds_sec)
                               ? format_seconds(Counters::forward_delay_bounds_sec[b])
                               : "+Inf";
    w.sample("kvpark_proxy_forward_delay_seconds_bucket", "le=\"" + le + "\"", cumulative);
  }
  w.sample_double("kvpark_proxy_forward_delay_seconds_sum", "", c.forward_delay_usec_sum / 1e6);
  w.sample("kvpark_proxy_forward_delay_seconds_count", "", cumulative);
  const std::pair<const char*, const std::atomic<uint64_t>*> by_api[] = {
      {"requests", c.api_answered},
      {"prompt_tokens", c.api_prompt_tokens},
      {"prefilled_tokens", c.api_prefilled_tokens},
      {"cached_tokens", c.api_cached_tokens}};
  for (const auto& [figure, values] : by_api) {
    const std::string name = std::string("kvpark_proxy_api_") + figure + "_total";
    const std::string help = std::string("The ") + figure +
                             " figure of answered requests, by front door (api: "
                             "chat_completions, responses, messages).";
    w.family(name.c_str(), "counter", help.c_str());
    for (size_t api = 0; api < size_t(Api::count); ++api)
      w.sample(name, std::string("api=\"") + api_string(Api(api)) + "\"", values[api]);
  }
  w.family("kvpark_proxy_billing_headers_normalized_total", "counter",
           "Messages system texts whose per-request billing stamp (x-anthropic-billing-header "
           "cch=) was normalised, as llama-server does, so siblings share the head.");
  w.sample("kvpark_proxy_billing_headers_normalized_total", "", c.billing_headers_normalized);
  w.family("kvpark_proxy_publishes_total", "counter", "Slot states parked in kvparkd.");
  w.sample("kvpark_proxy_publishes_total", "", c.publishes);
  w.family("kvpark_proxy_slot_files_not_split_total", "counter",
           "Saved slot files not parked: they failed the checks for parking as blocks "
           "(layout, token list; logged each).");
  w.sample("kvpark_proxy_slot_files_not_split_total", "", c.slot_files_not_split);
  w.family("kvpark_proxy_abandoned_requests_total", "counter",
           "Requests (chat, or passed through) whose client hung up before the whole "
           "answer: the upstream's request was abandoned.");
  w.sample("kvpark_proxy_abandoned_requests_total", "", c.abandoned);

  bool connected = false;
  for (const auto& route : proxy.routes) connected = connected || route->parking().connected();
  w.family("kvpark_proxy_kvparkd_connected", "gauge", "1 when kvparkd answers.");
  w.sample("kvpark_proxy_kvparkd_connected", "", connected ? 1 : 0);
  w.family("kvpark_proxy_upstream_up", "gauge",
           "1 when the upstream is verified and served cached (kvpark-proxy(1): upstream states).");
  for (const auto& route : proxy.routes)
    w.sample("kvpark_proxy_upstream_up", upstream_labels(*route), route->ready() ? 1 : 0);
  w.family("kvpark_proxy_upstream_slots", "gauge", "Slots of the upstream (/props total_slots).");
  for (const auto& route : proxy.routes)
    w.sample("kvpark_proxy_upstream_slots", upstream_labels(*route), route->slots().size());
  w.family("kvpark_proxy_upstream_busy_slots", "gauge", "Slots the proxy has taken now.");
  for (const auto& route : proxy.routes)
    w.sample("kvpark_proxy_upstream_busy_slots", upstream_labels(*route), route->slots().busy());
  w.family("kvpark_proxy_upstream_requests_in_progress", "gauge",
           "Requests routed to the upstream and not finished (waiting for a head or a slot "
           "included): its load for routing.");
  for (const auto& route : proxy.routes)
    w.sample("kvpark_proxy_upstream_requests_in_progress", upstream_labels(*route),
             route->load());
  return w.take() + http::process_metrics_text();
}

}  // namespace kvpark::proxy
