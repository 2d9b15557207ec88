// kvparkctl: the command line over org.kvpark.Park1 (proto/dbus_api.h).
//
// One verb per invocation, in the manner of systemctl: human output that fits
// the terminal by default, --json for scripts. Every failure maps to one of the
// documented exit codes (usage()); sdbus-c++ exceptions are caught in main().
#include <getopt.h>
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sdbus-c++/sdbus-c++.h>
#include <string>
#include <vector>

#include "ctl/format.h"
#include "proto/dbus_api.h"
#include "proto/version.h"

using namespace kvpark;
using namespace kvpark::ctl;

namespace {

constexpr useconds_t flush_poll_usec = 200'000;
constexpr uint64_t flush_line_interval_usec = 1'000'000;  // plain progress lines at most this often

enum Exit : int {
  exit_ok = 0,
  exit_failure = 1,
  exit_usage = 2,
  exit_not_found = 3,
  exit_permission_denied = 4,
  exit_unavailable = 5,
};

using Dict = std::map<std::string, sdbus::Variant>;

struct Options {
  bool json = false;
  int bus = 0;  // 0 auto, 1 system, 2 user (session)
  std::string ns, tier, entry_class;
  uint64_t limit = dbus_api::entries_page_default, offset = 0;
};

void usage(FILE* out) {
  fprintf(out,
          "Usage: kvparkctl [OPTIONS] VERB [ARGS]\n"
          "Query and steer kvparkd over D-Bus (org.kvpark.Park1).\n\n"
          "Verbs:\n"
          "  status                 daemon, arena, population and counters\n"
          "  stats                  every numeric figure, one per line\n"
          "  namespaces             the namespaces engines declared\n"
          "  list                   parked entries, most recently used first\n"
          "  show ID                one entry\n"
          "  pin ID | unpin ID      keep an entry from eviction, or release it\n"
          "  evict ID               drop an entry from every tier\n"
          "  flush                  write host-only entries to disk; waits, shows progress\n"
          "  drop-namespace ID      drop every entry of a namespace\n"
          "  set-limit NAME VALUE   arena-low-water, reservation-max, disk-capacity,\n"
          "                         disk-write-budget; VALUE a size such as 4G\n"
          "  reload                 re-read the configuration file\n\n"
          "Options:\n"
          "  --json                 machine-readable output (one JSON document)\n"
          "  --system               the system bus\n"
          "  --user                 the session bus of the calling user\n"
          "                         (default: the system bus when org.kvpark.Park1 is\n"
          "                         there or activatable on it, else the session bus)\n"
          "  --namespace ID         list: only this namespace (hex id)\n"
          "  --tier host|disk       list: only entries on this tier\n"
          "  --class shared|private list: only this class\n"
          "  --limit N              list: at most N entries (default %llu, max %llu)\n"
          "  --offset N             list: skip the first N\n"
          "  -h, --help             this help\n"
          "      --version          the version\n\n"
          "Mutating verbs need root or the daemon's admin group.\n\n"
          "Exit status: 0 ok, 1 failure, 2 usage error or invalid value, 3 not found,\n"
          "4 permission denied, 5 daemon unavailable.\n",
          static_cast<unsigned long long>(dbus_api::entries_page_default),
          static_cast<unsigned long long>(dbus_api::entries_page_max));
}

// A failure already reported to stderr, carrying its exit code.
struct Failure {
  int code;
};

[[noreturn]] void fail(int code, const std::string& message) {
  fprintf(stderr, "kvparkctl: %s\n", message.c_str());
  throw Failure{code};
}

int exit_code_for(const std::string& error_name) {
  if (error_name == dbus_api::error_not_found) return exit_not_found;
  if (error_name == dbus_api::error_permission_denied ||
      error_name == "org.freedesktop.DBus.Error.AccessDenied" ||
      error_name == "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired") {
    return exit_permission_denied;
  }
  if (error_name == dbus_api::error_invalid_argument) return exit_usage;
  if (error_name == dbus_api::error_unavailable ||
      error_name == "org.freedesktop.DBus.Error.ServiceUnknown" ||
      error_name == "org.freedesktop.DBus.Error.NameHasNoOwner" ||
      error_name == "org.freedesktop.DBus.Error.NoReply" ||
      error_name == "org.freedesktop.DBus.Error.Disconnected" ||
      error_name.rfind("System.Error.", 0) == 0) {  // sd-bus: the socket is not there
    return exit_unavailable;
  }
  return exit_failure;
}

uint64_t now_usec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000 + uint64_t(ts.tv_nsec) / 1000;
}

// --- reading a{sv} ------------------------------------------------------------

uint64_t u64(const Dict& d, const char* key) {
  auto it = d.find(key);
  if (it == d.end()) return 0;
  if (it->second.containsValueOfType<uint64_t>()) return it->second.get<uint64_t>();
  if (it->second.containsValueOfType<uint32_t>()) return it->second.get<uint32_t>();
  return 0;
}

std::string str(const Dict& d, const char* key) {
  auto it = d.find(key);
  return it != d.end() && it->second.containsValueOfType<std::string>()
             ? it->second.get<std::string>()
             : std::string();
}

bool flag(const Dict& d, const char* key) {
  auto it = d.find(key);
  return it != d.end() && it->second.containsValueOfType<bool>() && it->second.get<bool>();
}

std::string json_of(const sdbus::Variant& v) {
  if (v.containsValueOfType<std::string>()) return json_quote(v.get<std::string>());
  if (v.containsValueOfType<uint64_t>()) return std::to_string(v.get<uint64_t>());
  if (v.containsValueOfType<uint32_t>()) return std::to_string(v.get<uint32_t>());
  if (v.containsValueOfType<int64_t>()) return std::to_string(v.get<int64_t>());
  if (v.containsValueOfType<bool>()) return v.get<bool>() ? "true" : "false";
  return "null";
}

std::string json_of(const Dict& d) {
  std::string out = "{";
  for (const auto& [key, value] : d) {
    if (out.size() > 1) out += ",";
    out += json_quote(key) + ":" + json_of(value);
  }
  return out + "}";
}

std::string json_of(const std::vector<Dict>& list) {
  std::string out = "[";
  for (const Dict& d : list) out += (out.size() > 1 ? "," : "") + json_of(d);
  return out + "]";
}

// --- the bus ----------------------------------------------------------------

bool name_reachable(sdbus::IConnection& bus) {
  auto driver = sdbus::createProxy(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus");
  bool has_owner = false;
  driver->callMethod("NameHasOwner").onInterface("org.freedesktop.DBus")
      .withArguments(std::string(dbus_api::bus_name)).storeResultsTo(has_owner);
  if (has_owner) return true;
  std::vector<std::string> activatable;
  driver->callMethod("ListActivatableNames").onInterface("org.freedesktop.DBus")
      .storeResultsTo(activatable);
  for (const std::string& n : activatable) {
    if (n == dbus_api::bus_name) return true;
  }
  return false;
}

std::unique_ptr<sdbus::IConnection> connect_bus(int choice) {
  if (choice == 1) return sdbus::createSystemBusConnection();
  if (choice == 2) return sdbus::createSessionBusConnection();
  try {
    auto system = sdbus::createSystemBusConnection();
    if (name_reachable(*system)) return system;
  } catch (const sdbus::Error&) {
    // No system bus here: fall through to the session bus.
  }
  return sdbus::createSessionBusConnection();
}

class Park {
 public:
  explicit Park(sdbus::IConnection& bus)
      : proxy_(sdbus::createProxy(bus, dbus_api::bus_name, dbus_api::object_path)) {}

  template <typename... Results, typename... Args>
  void call(const char* method, std::tuple<Results&...> results, Args&&... args) {
    try {
      std::apply(
          [&](auto&... r) {
            proxy_->callMethod(method).onInterface(dbus_api::interface_name)
                .withArguments(std::forward<Args>(args)...).storeResultsTo(r...);
          },
          results);
    } catch (const sdbus::Error& e) {
      const int code = exit_code_for(e.getName());
      std::string message = e.getMessage();
      if (code == exit_unavailable) message = "kvparkd is not reachable on this bus (" +
                                              e.getName() + ": " + message + ")";
      fail(code, message);
    }
  }
  template <typename... Args>
  void call_void(const char* method, Args&&... args) {
    try {
      proxy_->callMethod(method).onInterface(dbus_api::interface_name)
          .withArguments(std::forward<Args>(args)...);
    } catch (const sdbus::Error& e) {
      fail(exit_code_for(e.getName()), e.getMessage());
    }
  }

 private:
  std::unique_ptr<sdbus::IProxy> proxy_;
};

// --- verbs ------------------------------------------------------------------

uint64_t parse_id(const std::string& text) {
  char* end = nullptr;
  const unsigned long long id = strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || text[0] == '-') fail(exit_usage, "not an entry id: " + text);
  return id;
}

// A hex id without its leading zeros (kvparkctl accepts it back as it is).
std::string short_hex(const std::string& hex) {
  const size_t first = hex.find_first_not_of('0');
  return first == std::string::npos ? "0" : hex.substr(first);
}

int verb_status(Park& park, const Options& o) {
  Dict s;
  park.call("Status", std::tie(s));
  if (o.json) return printf("%s\n", json_of(s).c_str()), exit_ok;
  printf("kvparkd %s, incarnation %016llx, up %s\n", str(s, "version").c_str(),
         static_cast<unsigned long long>(u64(s, "incarnation")),
         format_duration_usec(u64(s, "uptime_usec")).c_str());
  printf("     Socket: %s\n", str(s, "socket_path").c_str());
  printf("      Arena: %s used of %s, %s free (largest run %s), low water %s, %s pages of %s\n",
         format_bytes(u64(s, "arena_used_bytes")).c_str(),
         format_bytes(u64(s, "arena_data_bytes")).c_str(),
         format_bytes(u64(s, "arena_free_bytes")).c_str(),
         format_bytes(u64(s, "arena_largest_free_bytes")).c_str(),
         format_bytes(u64(s, "arena_low_water_bytes")).c_str(), str(s, "arena_pages").c_str(),
         format_bytes(u64(s, "arena_page_bytes")).c_str());
  if (flag(s, "disk_enabled")) {
    printf("       Disk: %s of %s in %s%s, written today %s of %s/day\n",
           format_bytes(u64(s, "disk_bytes")).c_str(),
           format_bytes(u64(s, "disk_capacity_bytes")).c_str(),
           str(s, "disk_directory").c_str(), flag(s, "disk_read_only") ? " (read-only)" : "",
           format_bytes(u64(s, "disk_written_today_bytes")).c_str(),
           format_bytes(u64(s, "disk_write_budget_bytes_per_day")).c_str());
  } else {
    printf("       Disk: off\n");
  }
  printf("    Entries: %llu (%llu blocks, %llu snapshots, %llu pinned) in %llu namespaces\n",
         (unsigned long long)u64(s, "entries"), (unsigned long long)u64(s, "blocks"),
         (unsigned long long)u64(s, "snapshots"), (unsigned long long)u64(s, "pinned"),
         (unsigned long long)u64(s, "namespaces"));
  printf("    Clients: %llu connections, %llu leases, %llu reservations\n",
         (unsigned long long)u64(s, "connections"), (unsigned long long)u64(s, "leases"),
         (unsigned long long)u64(s, "reservations"));
  // lookup_hit_tokens: what lookups found restorable (a client that looks up twice
  // counts twice); restored_tokens: what clients reported restoring at release.
  printf("    Lookups: %llu, %llu tokens restorable (root %llu, shared prefix %llu, "
         "private turn %llu); %llu tokens restored\n",
         (unsigned long long)u64(s, "lookups"), (unsigned long long)u64(s, "lookup_hit_tokens"),
         (unsigned long long)u64(s, "reuse_root"),
         (unsigned long long)u64(s, "reuse_shared_stable_prefix"),
         (unsigned long long)u64(s, "reuse_private_turn_closure"),
         (unsigned long long)u64(s, "restored_tokens"));
  printf("  Evictions: %llu; dedup hits %llu; protocol errors %llu; corrupt seals %llu; "
         "corrupt payloads %llu\n",
         (unsigned long long)u64(s, "evictions"), (unsigned long long)u64(s, "dedup_hits"),
         (unsigned long long)u64(s, "protocol_errors"),
         (unsigned long long)u64(s, "seal_corrupt"), (unsigned long long)u64(s, "corrupt_payloads"));
  return exit_ok;
}

int verb_stats(Park& park, const Options& o) {
  std::map<std::string, uint64_t> stats;
  park.call("Stats", std::tie(stats));
  if (o.json) {
    std::string out = "{";
    for (const auto& [key, value] : stats) {
      out += (out.size() > 1 ? "," : "") + json_quote(key) + ":" + std::to_string(value);
    }
    printf("%s}\n", out.c_str());
    return exit_ok;
  }
  size_t width = 0;
  for (const auto& [key, value] : stats) width = std::max(width, key.size());
  for (const auto& [key, value] : stats) {
    printf("%-*s  %llu\n", static_cast<int>(width), key.c_str(),
           static_cast<unsigned long long>(value));
  }
  return exit_ok;
}

int verb_namespaces(Park& park, const Options& o) {
  std::vector<Dict> list;
  park.call("ListNamespaces", std::tie(list));
  if (o.json) return printf("%s\n", json_of(list).c_str()), exit_ok;
  std::vector<std::vector<std::string>> rows;
  for (const Dict& n : list) {
    rows.push_back({short_hex(str(n, "id")), std::to_string(u64(n, "block_tokens")),
                    format_bytes(u64(n, "block_payload_bytes")),
                    flag(n, "snapshot_required") ? "yes" : "no", std::to_string(u64(n, "blocks")),
                    std::to_string(u64(n, "snapshots")), format_bytes(u64(n, "host_bytes")),
                    format_bytes(u64(n, "disk_bytes"))});
  }
  fputs(render_table({{"NAMESPACE", false, true, 12}, {"BLOCK", true}, {"BLOCK SIZE", true},
                      {"SNAP-REQ"}, {"BLOCKS", true}, {"SNAPSHOTS", true}, {"HOST", true},
                      {"DISK", true}},
                     rows, terminal_columns())
            .c_str(),
        stdout);
  printf("\n%zu namespaces.\n", list.size());
  return exit_ok;
}

std::vector<std::string> entry_row(const Dict& e) {
  return {std::to_string(u64(e, "id")), short_hex(str(e, "namespace")), str(e, "kind"), str(e, "tier"),
          str(e, "class"), std::to_string(u64(e, "position")), format_bytes(u64(e, "bytes")),
          std::to_string(u64(e, "hits")), format_age_usec(u64(e, "idle_usec")),
          std::to_string(u64(e, "leases")), flag(e, "pinned") ? "yes" : "-", str(e, "key")};
}

int verb_list(Park& park, const Options& o) {
  Dict filter{{"limit", sdbus::Variant(o.limit)}, {"offset", sdbus::Variant(o.offset)}};
  if (!o.ns.empty()) filter["namespace"] = sdbus::Variant(o.ns);
  if (!o.tier.empty()) filter["tier"] = sdbus::Variant(o.tier);
  if (!o.entry_class.empty()) filter["class"] = sdbus::Variant(o.entry_class);
  std::vector<Dict> list;
  uint64_t total = 0;
  park.call("ListEntries", std::tie(list, total), filter);
  if (o.json) {
    printf("{\"total\":%llu,\"offset\":%llu,\"entries\":%s}\n", (unsigned long long)total,
           (unsigned long long)o.offset, json_of(list).c_str());
    return exit_ok;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Dict& e : list) rows.push_back(entry_row(e));
  fputs(render_table({{"ID", true}, {"NAMESPACE", false, true, 6}, {"KIND"}, {"TIER"}, {"CLASS"},
                      {"POS", true}, {"SIZE", true}, {"HITS", true}, {"IDLE", true},
                      {"LEASES", true}, {"PIN"}, {"KEY", false, true, 6}},
                     rows, terminal_columns())
            .c_str(),
        stdout);
  printf("\n%zu of %llu entries listed", list.size(), (unsigned long long)total);
  if (o.offset + list.size() < total) {
    printf(" (--offset %llu for more)", (unsigned long long)(o.offset + list.size()));
  }
  printf(".\n");
  return exit_ok;
}

int verb_show(Park& park, const Options& o, uint64_t id) {
  Dict e;
  park.call("ShowEntry", std::tie(e), id);
  if (o.json) return printf("%s\n", json_of(e).c_str()), exit_ok;
  const std::pair<const char*, std::string> lines[] = {
      {"Id", std::to_string(u64(e, "id"))},
      {"Namespace", str(e, "namespace")},
      {"Kind", str(e, "kind")},
      {"Key", str(e, "key")},
      {"Tier", str(e, "tier")},
      {"Class", str(e, "class")},
      {"Evidence", str(e, "evidence")},
      {"Position", std::to_string(u64(e, "position")) + " tokens (" +
                       std::to_string(u64(e, "tail_tokens")) + " in the tail)"},
      {"Size", format_bytes(u64(e, "bytes")) + " (" + std::to_string(u64(e, "bytes")) + " bytes)"},
      {"Hits", std::to_string(u64(e, "hits"))},
      {"Idle", format_duration_usec(u64(e, "idle_usec"))},
      {"Session", std::to_string(u64(e, "creator_session"))},
      {"Leases", std::to_string(u64(e, "leases"))},
      {"Pinned", flag(e, "pinned") ? "yes" : "no"},
  };
  for (const auto& [label, value] : lines) printf("%10s: %s\n", label, value.c_str());
  return exit_ok;
}

std::string progress_text(const Dict& p) {
  return std::to_string(u64(p, "entries_done")) + "/" + std::to_string(u64(p, "entries_total")) +
         " entries, " + format_bytes(u64(p, "bytes_done")) + "/" +
         format_bytes(u64(p, "bytes_total"));
}

int verb_flush(Park& park, const Options& o) {
  uint64_t job = 0;
  park.call("Flush", std::tie(job));
  const bool bar = !o.json && stdout_is_tty();
  uint64_t last_line_usec = 0;
  std::string last_text;
  Dict p;
  for (;;) {
    p.clear();  // sdbus-c++ inserts into a map: stale keys would never update
    park.call("GetFlushProgress", std::tie(p), job);
    const uint64_t total = u64(p, "bytes_total"), done = u64(p, "bytes_done");
    const unsigned percent = total == 0 ? (flag(p, "done") ? 100 : 0)
                                        : static_cast<unsigned>(done * 100 / total);
    if (bar) {
      const unsigned columns = terminal_columns();
      const std::string text = " " + std::to_string(percent) + "% " + progress_text(p);
      const unsigned bar_width = columns > text.size() + 12 ? std::min<unsigned>(
          40, columns - static_cast<unsigned>(text.size()) - 3) : 10;
      const unsigned filled = bar_width * percent / 100;
      printf("\r[%s%s]%s\033[K", std::string(filled, '#').c_str(),
             std::string(bar_width - filled, ' ').c_str(), text.c_str());
      fflush(stdout);
    } else if (!o.json) {
      const std::string text = progress_text(p);
      if (flag(p, "done") || (text != last_text && now_usec() - last_line_usec >= flush_line_interval_usec)) {
        printf("flush job %llu: %u%% %s\n", (unsigned long long)job, percent, text.c_str());
        last_line_usec = now_usec();
        last_text = text;
      }
    }
    if (flag(p, "done")) break;
    usleep(flush_poll_usec);
  }
  if (bar) printf("\n");
  if (o.json) printf("%s\n", json_of(p).c_str());
  if (str(p, "status") != "ok") fail(exit_failure, "flush job " + std::to_string(job) +
                                                       " failed: " + str(p, "status"));
  return exit_ok;
}

// Each verb and how many arguments it takes; checked before the bus is touched.
const std::map<std::string, size_t> verb_arguments = {
    {"status", 0}, {"stats", 0}, {"namespaces", 0}, {"list", 0}, {"show", 1},
    {"pin", 1}, {"unpin", 1}, {"evict", 1}, {"flush", 0}, {"drop-namespace", 1},
    {"set-limit", 2}, {"reload", 0}};

int run_verb(Park& park, const Options& o, const std::vector<std::string>& args) {
  const std::string& verb = args[0];
  auto done = [&](const std::string& json) {
    if (o.json) printf("%s\n", json.c_str());
    return exit_ok;
  };
  if (verb == "status") return verb_status(park, o);
  if (verb == "stats") return verb_stats(park, o);
  if (verb == "namespaces") return verb_namespaces(park, o);
  if (verb == "list") return verb_list(park, o);
  if (verb == "show") return verb_show(park, o, parse_id(args[1]));
  if (verb == "pin" || verb == "unpin") {
    const uint64_t id = parse_id(args[1]);
    park.call_void(verb == "pin" ? "Pin" : "Unpin", id);
    return done("{\"id\":" + std::to_string(id) + ",\"pinned\":" +
                (verb == "pin" ? "true" : "false") + "}");
  }
  if (verb == "evict") {
    const uint64_t id = parse_id(args[1]);
    park.call_void("Evict", id);
    return done("{\"id\":" + std::to_string(id) + ",\"evicted\":true}");
  }
  if (verb == "flush") return verb_flush(park, o);
  if (verb == "drop-namespace") {
    uint64_t dropped = 0;
    park.call("DropNamespace", std::tie(dropped), args[1]);
    if (!o.json) printf("Dropped %llu entries.\n", (unsigned long long)dropped);
    return done("{\"namespace\":" + json_quote(args[1]) + ",\"dropped\":" +
                std::to_string(dropped) + "}");
  }
  if (verb == "set-limit") {
    uint64_t value = 0;
    if (!parse_size(args[2], value)) fail(exit_usage, "not a size: " + args[2]);
    park.call_void("SetLimit", args[1], value);
    return done("{\"name\":" + json_quote(args[1]) + ",\"value\":" + std::to_string(value) + "}");
  }
  if (verb == "reload") {
    std::string message;
    park.call("Reload", std::tie(message));
    if (!o.json && !message.empty()) printf("%s\n", message.c_str());
    return done("{\"message\":" + json_quote(message) + "}");
  }
  fail(exit_usage, "unknown verb '" + verb + "' (see kvparkctl --help)");
}

}  // namespace

int main(int argc, char** argv) {
  enum { opt_json = 1, opt_system, opt_user, opt_namespace, opt_tier, opt_class, opt_limit,
         opt_offset, opt_version };
  static const option long_options[] = {
      {"json", no_argument, nullptr, opt_json},
      {"system", no_argument, nullptr, opt_system},
      {"user", no_argument, nullptr, opt_user},
      {"namespace", required_argument, nullptr, opt_namespace},
      {"tier", required_argument, nullptr, opt_tier},
      {"class", required_argument, nullptr, opt_class},
      {"limit", required_argument, nullptr, opt_limit},
      {"offset", required_argument, nullptr, opt_offset},
      {"help", no_argument, nullptr, 'h'},
      {"version", no_argument, nullptr, opt_version},
      {nullptr, 0, nullptr, 0},
  };
  Options o;
  auto number = [](const char* flag_name, const char* text, uint64_t& ret) {
    char* end = nullptr;
    ret = strtoull(text, &end, 10);
    if (*text == '\0' || *text == '-' || *end != '\0') {
      fprintf(stderr, "kvparkctl: %s: not a number: %s\n", flag_name, text);
      return false;
    }
    return true;
  };
  int c;
  while ((c = getopt_long(argc, argv, "h", long_options, nullptr)) != -1) {
    switch (c) {
      case opt_json: o.json = true; break;
      case opt_system: o.bus = 1; break;
      case opt_user: o.bus = 2; break;
      case opt_namespace: o.ns = optarg; break;
      case opt_tier:
        o.tier = optarg;
        if (o.tier != "host" && o.tier != "disk") {
          fprintf(stderr, "kvparkctl: --tier: expected host or disk\n");
          return exit_usage;
        }
        break;
      case opt_class:
        o.entry_class = optarg;
        if (o.entry_class != "shared" && o.entry_class != "private") {
          fprintf(stderr, "kvparkctl: --class: expected shared or private\n");
          return exit_usage;
        }
        break;
      case opt_limit:
        if (!number("--limit", optarg, o.limit)) return exit_usage;
        break;
      case opt_offset:
        if (!number("--offset", optarg, o.offset)) return exit_usage;
        break;
      case 'h': usage(stdout); return exit_ok;
      case opt_version: printf("kvparkctl %s\n", kvpark::version); return exit_ok;
      default: usage(stderr); return exit_usage;
    }
  }
  // GNU getopt permutes argv, so options may also follow the verb.
  std::vector<std::string> args(argv + optind, argv + argc);
  if (args.empty()) {
    usage(stderr);
    return exit_usage;
  }
  if (o.limit == 0 || o.limit > dbus_api::entries_page_max) {
    fprintf(stderr, "kvparkctl: --limit: 1..%llu\n",
            static_cast<unsigned long long>(dbus_api::entries_page_max));
    return exit_usage;
  }
  const auto verb = verb_arguments.find(args[0]);
  if (verb == verb_arguments.end()) {
    fprintf(stderr, "kvparkctl: unknown verb '%s' (see kvparkctl --help)\n", args[0].c_str());
    return exit_usage;
  }
  if (args.size() != verb->second + 1) {
    fprintf(stderr, "kvparkctl: %s takes %zu argument%s (see kvparkctl --help)\n",
            args[0].c_str(), verb->second, verb->second == 1 ? "" : "s");
    return exit_usage;
  }
  try {
    std::unique_ptr<sdbus::IConnection> bus;
    try {
      bus = connect_bus(o.bus);
    } catch (const sdbus::Error& e) {
      fail(exit_unavailable, "cannot connect to the " +
                                 std::string(o.bus == 1 ? "system" : "session") +
                                 " bus: " + e.getMessage());
    }
    Park park(*bus);
    return run_verb(park, o, args);
  } catch (const Failure& f) {
    return f.code;
  } catch (const sdbus::Error& e) {
    fprintf(stderr, "kvparkctl: %s\n", e.what());
    return exit_code_for(e.getName());
  }
}
