// kvparkctl: the command line over org.kvpark.Park1 (proto/dbus_api.h).
//
// One verb per invocation, in the manner of systemctl: human output, tables at
// full width into a pipe and cut to the terminal on a TTY, --json for scripts
// (the schema of kvparkd's HTTP status API, proto/json_schema.h). Without a bus
// that reaches kvparkd, the read verbs use the HTTP status API and say so on
// stderr; the others explain how to get a bus. Every failure maps to one of the
// documented exit codes (failure.h).
#include <getopt.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ctl/bus.h"
#include "ctl/failure.h"
#include "ctl/format.h"
#include "ctl/read_verbs.h"
#include "ctl/record.h"
#include "ctl/source.h"
#include "proto/dbus_api.h"
#include "proto/names.h"
#include "proto/paths.h"
#include "proto/size.h"
#include "proto/version.h"

using namespace kvpark;
using namespace kvpark::ctl;

namespace {

constexpr useconds_t flush_poll_usec = 200'000;
constexpr uint64_t flush_line_interval_usec = 1'000'000;  // plain progress lines at most this often

struct Options {
  bool json = false;
  bool full = false;
  BusChoice bus = BusChoice::Auto;
  std::string http;  // --http; empty: http_listen of the daemon's file, else the default
  EntryQuery query{.limit = dbus_api::entries_page_default};
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
          "  --json                 machine-readable output (one JSON document, the schema\n"
          "                         of kvparkd's HTTP status API)\n"
          "  --system               the system bus\n"
          "  --user                 the session bus of the calling user\n"
          "                         (default: the system bus when org.kvpark.Park1 is\n"
          "                         there or activatable on it, else the session bus)\n"
          "  --http HOST:PORT       kvparkd's HTTP status API, read when no bus reaches\n"
          "                         kvparkd (default: http_listen in %s,\n"
          "                         else %s)\n"
          "  --full                 tables at full width on a terminal too\n"
          "  --namespace ID         list: only this namespace (hex id)\n"
          "  --tier host|disk       list: only entries on this tier\n"
          "  --class shared|private list: only this class\n"
          "  --limit N              list: at most N entries (default %llu, max %llu)\n"
          "  --offset N             list: skip the first N\n"
          "  -h, --help             this help\n"
          "      --version          the version\n\n"
          "Without a bus reaching kvparkd, status, stats, namespaces, list and show read\n"
          "its HTTP status API instead (said on stderr). Mutating verbs need D-Bus and\n"
          "root or the daemon's admin group.\n\n"
          "Exit status: 0 ok, 1 failure, 2 usage error or invalid value, 3 not found,\n"
          "4 permission denied, 5 daemon unavailable (no bus reaches it and, for read\n"
          "verbs, nothing answers HTTP).\n",
          daemon_config_path_default, http_listen_default,
          static_cast<unsigned long long>(dbus_api::entries_page_default),
          static_cast<unsigned long long>(dbus_api::entries_page_max));
}

uint64_t now_usec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000 + uint64_t(ts.tv_nsec) / 1000;
}

// --- where kvparkd is -------------------------------------------------------

std::string trim(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

// The daemon's HTTP address as it publishes it: --http, else http_listen in its
// configuration file, else the default. Empty when the file turns HTTP off.
std::string http_address(const Options& o, std::string& ret_origin) {
  if (!o.http.empty()) {
    ret_origin = "--http";
    return o.http;
  }
  std::ifstream file(daemon_config_path_default);
  for (std::string line; std::getline(file, line);) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos || trim(line.substr(0, eq)) != "http_listen") continue;
    ret_origin = std::string("http_listen in ") + daemon_config_path_default;
    const std::string value = trim(line.substr(eq + 1));
    return value == "off" ? "" : value;
  }
  ret_origin = "the default";
  return http_listen_default;
}

// The one message for "no bus reaches kvparkd", naming every way to get one.
void explain_no_bus(const std::string& bus_reason, const std::string& http_note) {
  fprintf(stderr,
          "kvparkctl: cannot reach kvparkd over D-Bus: %s\n"
          "%s"
          "  To reach it, either:\n"
          "  - run it as the system service (systemctl enable --now kvparkd), found on\n"
          "    the system bus (kvparkctl --system);\n"
          "  - run kvparkd --dbus session in a login session and use kvparkctl --user;\n"
          "  - without a session bus (ssh, a container), run both inside one:\n"
          "    dbus-run-session -- $SHELL, then kvparkd --dbus session & and kvparkctl there;\n"
          "  - or run kvparkd --dbus off: status, stats, namespaces, list and show then\n"
          "    read its HTTP status API (kvparkctl --http HOST:PORT); other verbs need D-Bus.\n",
          bus_reason.c_str(), http_note.c_str());
}

// --- verbs ------------------------------------------------------------------

uint64_t parse_id(const std::string& text) {
  char* end = nullptr;
  const unsigned long long id = strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || text[0] < '0' || text[0] > '9') {
    fail(exit_usage, "not an entry id: " + text);
  }
  return id;
}

// A namespace id as the daemon reads and prints it (proto/names.h), as 32 digits;
// "" if it is not one.
std::string namespace_hex32(const std::string& text) {
  Hash128 id;
  return parse_hex128(text, id) ? hex128(id) : std::string();
}

std::string progress_text(const Record& p) {
  auto count = [&p](const char* key) { return std::to_string(number_of(p, key)); };
  return count("entries_done") + "/" + count("entries_total") + " entries, " +
         format_bytes(number_of(p, "bytes_done")) + "/" + format_bytes(number_of(p, "bytes_total"));
}

int verb_flush(Bus& bus, const Options& o) {
  const uint64_t job = bus.start_flush();
  const bool bar = !o.json && stdout_is_tty();
  uint64_t last_line_usec = 0;
  std::string last_text;
  Record p;
  for (;;) {
    p = bus.flush_progress(job);
    const uint64_t total = number_of(p, "bytes_total"), done = number_of(p, "bytes_done");
    const unsigned percent = total == 0 ? (flag_of(p, "done") ? 100 : 0)
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
      if (flag_of(p, "done") ||
          (text != last_text && now_usec() - last_line_usec >= flush_line_interval_usec)) {
        printf("flush job %llu: %u%% %s\n", (unsigned long long)job, percent, text.c_str());
        last_line_usec = now_usec();
        last_text = text;
      }
    }
    if (flag_of(p, "done")) break;
    usleep(flush_poll_usec);
  }
  if (bar) printf("\n");
  if (o.json) printf("%s\n", json_of(p).c_str());
  if (text_of(p, "status") != "ok") {
    fail(exit_failure, "flush job " + std::to_string(job) + " failed: " + text_of(p, "status"));
  }
  return exit_ok;
}

// Each verb and how many arguments it takes; checked before the bus is touched.
const std::map<std::string, size_t> verb_arguments = {
    {"status", 0}, {"stats", 0}, {"namespaces", 0}, {"list", 0}, {"show", 1},
    {"pin", 1}, {"unpin", 1}, {"evict", 1}, {"flush", 0}, {"drop-namespace", 1},
    {"set-limit", 2}, {"reload", 0}};
// The verbs that only read: these can be answered over HTTP.
const std::set<std::string> read_verbs = {"status", "stats", "namespaces", "list", "show"};

int run_read_verb(ReadSource& source, const Options& o, const std::vector<std::string>& args) {
  const ReadOptions r{.json = o.json, .full = o.full, .query = o.query};
  const std::string& verb = args[0];
  if (verb == "status") return verb_status(source, r);
  if (verb == "stats") return verb_stats(source, r);
  if (verb == "namespaces") return verb_namespaces(source, r);
  if (verb == "list") return verb_list(source, r);
  return verb_show(source, r, parse_id(args[1]));
}

int run_verb(Bus& bus, const Options& o, const std::vector<std::string>& args) {
  const std::string& verb = args[0];
  if (read_verbs.count(verb) != 0) return run_read_verb(*bus.read_source(), o, args);
  auto done = [&](const std::string& json) {
    if (o.json) printf("%s\n", json.c_str());
    return exit_ok;
  };
  if (verb == "pin" || verb == "unpin") {
    const uint64_t id = parse_id(args[1]);
    bus.set_pinned(id, verb == "pin");
    return done("{\"id\":" + json_quote(std::to_string(id)) + ",\"pinned\":" +
                (verb == "pin" ? "true" : "false") + "}");
  }
  if (verb == "evict") {
    const uint64_t id = parse_id(args[1]);
    bus.evict(id);
    return done("{\"id\":" + json_quote(std::to_string(id)) + ",\"evicted\":true}");
  }
  if (verb == "flush") return verb_flush(bus, o);
  if (verb == "drop-namespace") {
    const uint64_t dropped = bus.drop_namespace(args[1]);
    if (!o.json) printf("Dropped %llu entries.\n", (unsigned long long)dropped);
    return done("{\"namespace\":" + json_quote(args[1]) + ",\"dropped\":" +
                std::to_string(dropped) + "}");
  }
  if (verb == "set-limit") {
    uint64_t value = 0;
    if (!parse_size(args[2], value)) {
      fail(exit_usage, "not a size: " + args[2] + " (a byte count such as 4096, 512M or 4G)");
    }
    bus.set_limit(args[1], value);
    return done("{\"name\":" + json_quote(args[1]) + ",\"value\":" + std::to_string(value) + "}");
  }
  // reload
  const std::string message = bus.reload();
  if (!o.json && !message.empty()) printf("%s\n", message.c_str());
  return done("{\"message\":" + json_quote(message) + "}");
}

// Runs the verb over D-Bus; without a bus reaching kvparkd, a read verb over HTTP.
int run(const Options& o, const std::vector<std::string>& args) {
  std::string bus_reason;
  try {
    std::unique_ptr<Bus> bus = Bus::open(o.bus);
    return run_verb(*bus, o, args);
  } catch (const Unreachable& u) {
    bus_reason = u.reason;
  }
  if (read_verbs.count(args[0]) == 0) {
    explain_no_bus(bus_reason, "  " + args[0] + " needs D-Bus.\n");
    return exit_unavailable;
  }
  std::string origin;
  const std::string address = http_address(o, origin);
  if (address.empty()) {
    explain_no_bus(bus_reason, "  and kvparkd's HTTP status API is off (" + origin + ").\n");
    return exit_unavailable;
  }
  fprintf(stderr, "kvparkctl: no D-Bus (%s); reading kvparkd's HTTP status API at %s instead\n",
          bus_reason.c_str(), address.c_str());
  try {
    std::unique_ptr<ReadSource> http = open_http_source(address);
    return run_read_verb(*http, o, args);
  } catch (const Unreachable& u) {
    explain_no_bus(bus_reason, "  and " + u.reason + ", the address from " + origin + ".\n");
    return exit_unavailable;
  }
}

}  // namespace

int main(int argc, char** argv) {
  enum { opt_json = 1, opt_system, opt_user, opt_http, opt_full, opt_namespace, opt_tier,
         opt_class, opt_limit, opt_offset, opt_version };
  static const option long_options[] = {
      {"json", no_argument, nullptr, opt_json},
      {"system", no_argument, nullptr, opt_system},
      {"user", no_argument, nullptr, opt_user},
      {"http", required_argument, nullptr, opt_http},
      {"full", no_argument, nullptr, opt_full},
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
      case opt_system: o.bus = BusChoice::System; break;
      case opt_user: o.bus = BusChoice::Session; break;
      case opt_http: o.http = optarg; break;
      case opt_full: o.full = true; break;
      case opt_namespace:
        o.query.namespace_hex = namespace_hex32(optarg);
        if (o.query.namespace_hex.empty()) {
          fprintf(stderr, "kvparkctl: --namespace: not a hex id (up to 32 hex digits): %s\n",
                  optarg);
          return exit_usage;
        }
        break;
      case opt_tier:
        o.query.tier = optarg;
        if (Tier tier; !parse_tier(o.query.tier, tier) || tier == Tier::Both) {
          fprintf(stderr, "kvparkctl: --tier: expected host or disk\n");
          return exit_usage;
        }
        break;
      case opt_class:
        o.query.entry_class = optarg;
        if (EntryClass entry_class; !parse_entry_class(o.query.entry_class, entry_class)) {
          fprintf(stderr, "kvparkctl: --class: expected shared or private\n");
          return exit_usage;
        }
        break;
      case opt_limit:
        if (!number("--limit", optarg, o.query.limit)) return exit_usage;
        break;
      case opt_offset:
        if (!number("--offset", optarg, o.query.offset)) return exit_usage;
        break;
      case 'h': usage(stdout); return exit_ok;
      case opt_version: printf("kvparkctl %s\n", kvpark::version); return exit_ok;
      default:
        fprintf(stderr, "kvparkctl: see kvparkctl --help for the options\n");
        return exit_usage;
    }
  }
  // GNU getopt permutes argv, so options may also follow the verb.
  std::vector<std::string> args(argv + optind, argv + argc);
  if (args.empty()) {
    usage(stderr);
    return exit_usage;
  }
  if (o.query.limit == 0 || o.query.limit > dbus_api::entries_page_max) {
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
    return run(o, args);
  } catch (const Failure& f) {
    return f.code;
  }
}
