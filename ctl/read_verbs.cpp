// kvparkctl's read verbs (see read_verbs.h).
#include "ctl/read_verbs.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "ctl/failure.h"
#include "ctl/format.h"
#include "ctl/record.h"

namespace kvpark::ctl {
namespace {

// A hex id without its leading zeros (kvparkctl accepts it back as it is).
std::string short_hex(const std::string& hex) {
  const size_t first = hex.find_first_not_of('0');
  return first == std::string::npos ? "0" : hex.substr(first);
}

std::string count(const Record& r, const char* key) { return std::to_string(number_of(r, key)); }

std::vector<std::string> entry_row(const Record& e) {
  return {text_of(e, "id"), short_hex(text_of(e, "namespace")), text_of(e, "kind"),
          text_of(e, "tier"), text_of(e, "class"), count(e, "position"),
          format_bytes(number_of(e, "bytes")), count(e, "hits"),
          format_age_usec(number_of(e, "idle_usec")), count(e, "leases"),
          flag_of(e, "pinned") ? "yes" : "-", text_of(e, "key_hash")};
}

// One remote histogram's status figures (daemon/latency_histogram.h): "probe 12 timed,
// p50 250us, p99 1.0ms, max 1.3ms", or "probe none timed".
std::string latency_summary(const Record& s, const std::string& key, const char* what) {
  const auto usec = [&](const char* figure) {
    return format_latency_usec(number_of(s, (key + "_usec_" + figure).c_str()));
  };
  const uint64_t timed = number_of(s, (key + "_timed").c_str());
  if (timed == 0) return std::string(what) + " none timed";
  return std::string(what) + " " + std::to_string(timed) + " timed, p50 " + usec("p50") + ", p99 " +
         usec("p99") + ", max " + usec("max");
}

}  // namespace

int verb_status(ReadSource& source, const ReadOptions& o) {
  const Record s = source.status();
  if (o.json) return printf("%s\n", json_of(s).c_str()), exit_ok;
  printf("kvparkd %s, incarnation %s, up %s\n", text_of(s, "version").c_str(),
         text_of(s, "incarnation").c_str(), format_duration_usec(number_of(s, "uptime_usec")).c_str());
  printf("     Socket: %s\n", text_of(s, "socket_path").c_str());
  printf("      Arena: %s used of %s, %s free (largest run %s), low water %s, %s pages of %s\n",
         format_bytes(number_of(s, "arena_used_bytes")).c_str(),
         format_bytes(number_of(s, "arena_data_bytes")).c_str(),
         format_bytes(number_of(s, "arena_free_bytes")).c_str(),
         format_bytes(number_of(s, "arena_largest_free_bytes")).c_str(),
         format_bytes(number_of(s, "arena_low_water_bytes")).c_str(),
         text_of(s, "arena_pages").c_str(), format_bytes(number_of(s, "arena_page_bytes")).c_str());
  if (flag_of(s, "arena_adopted")) {
    printf("    Restart: %s%s\n", text_of(s, "adoption").c_str(),
           flag_of(s, "adoption_hold") ? "; adopted extents wait for the previous instance's engines" : "");
  } else if (!text_of(s, "fresh_start_reason").empty()) {
    printf("    Restart: started with an empty arena: %s\n", text_of(s, "fresh_start_reason").c_str());
  }
  if (flag_of(s, "disk_enabled")) {
    printf("       Disk: %s of %s in %s%s, written today %s of %s/day\n",
           format_bytes(number_of(s, "disk_bytes")).c_str(),
           format_bytes(number_of(s, "disk_capacity_bytes")).c_str(),
           text_of(s, "disk_directory").c_str(), flag_of(s, "disk_read_only") ? " (read-only)" : "",
           format_bytes(number_of(s, "disk_written_today_bytes")).c_str(),
           format_bytes(number_of(s, "disk_write_budget_bytes_per_day")).c_str());
    if (number_of(s, "spill_failures") > 0)
      printf("             spills failed: %s (no space %s, I/O error %s, read-only %s, damaged "
             "header %s): those entries stay in memory\n",
             count(s, "spill_failures").c_str(), count(s, "spill_failures_no_space").c_str(),
             count(s, "spill_failures_io_error").c_str(),
             count(s, "spill_failures_read_only").c_str(),
             count(s, "spill_failures_damaged_header").c_str());
  } else {
    printf("       Disk: off\n");
  }
  if (flag_of(s, "remote_enabled")) {
    printf("     Remote: %s %s (%s, %s of %s nodes up), writes %s; %s hits (%s in), "
           "%s written (%s out), %s probes; %s errors, %s corrupt, %s refused\n",
           text_of(s, "remote_seeds").c_str(), flag_of(s, "remote_up") ? "up" : "DOWN",
           flag_of(s, "remote_cluster") ? "cluster" : "single", count(s, "remote_nodes_up").c_str(),
           count(s, "remote_nodes_known").c_str(), text_of(s, "remote_write").c_str(),
           count(s, "remote_hits").c_str(), format_bytes(number_of(s, "remote_bytes_in")).c_str(),
           count(s, "remote_writes").c_str(), format_bytes(number_of(s, "remote_bytes_out")).c_str(),
           count(s, "remote_probes").c_str(), count(s, "remote_errors").c_str(),
           count(s, "remote_corrupt").c_str(), count(s, "remote_writes_refused").c_str());
    printf("    Latency: %s; %s; %s; %s\n", latency_summary(s, "remote_probe", "probe").c_str(),
           latency_summary(s, "remote_get", "restore").c_str(),
           latency_summary(s, "remote_write", "write").c_str(),
           latency_summary(s, "remote_queue", "queued").c_str());
    // The load-versus-recompute model's inputs, as measured so far.
    const uint64_t bandwidth = number_of(s, "remote_read_bytes_per_second");
    const uint64_t latency = number_of(s, "remote_read_latency_usec");
    printf("      Reads: %s, %s per restore (load versus recompute)\n",
           bandwidth > 0 ? (format_bytes(bandwidth) + "/s").c_str() : "bandwidth not measured yet",
           latency > 0 ? (std::to_string(latency) + " us").c_str() : "latency not measured yet");
  } else {
    printf("     Remote: off\n");
  }
  printf("    Entries: %s (%s blocks, %s snapshots, %s pinned) in %s namespaces\n",
         count(s, "entries").c_str(), count(s, "blocks").c_str(), count(s, "snapshots").c_str(),
         count(s, "pinned").c_str(), count(s, "namespaces").c_str());
  printf("    Clients: %s connections, %s leases, %s reservations\n",
         count(s, "connections").c_str(), count(s, "leases").c_str(),
         count(s, "reservations").c_str());
  // lookup_hit_tokens: what lookups found restorable once their promotions settled
  // (a client that looks up twice counts twice); restored_tokens: what clients
  // reported restoring at release.
  printf("    Lookups: %s, %s tokens restorable (root %s, shared prefix %s, "
         "private turn %s); %s tokens restored\n",
         count(s, "lookups").c_str(), count(s, "lookup_hit_tokens").c_str(),
         count(s, "reuse_root").c_str(), count(s, "reuse_shared_stable_prefix").c_str(),
         count(s, "reuse_private_turn_closure").c_str(), count(s, "restored_tokens").c_str());
  printf(
      "  Evictions: %s; dedup hits %s; protocol errors %s; corrupt seals %s; "
      "corrupt payloads %s (reports refuted %s)\n",
      count(s, "evictions").c_str(), count(s, "dedup_hits").c_str(),
      count(s, "protocol_errors").c_str(), count(s, "seal_corrupt").c_str(),
      count(s, "corrupt_payloads").c_str(), count(s, "corrupt_reports_refuted").c_str());
  return exit_ok;
}

int verb_stats(ReadSource& source, const ReadOptions& o) {
  const Record stats = stats_of(source.status());
  if (o.json) return printf("%s\n", json_of(stats).c_str()), exit_ok;
  size_t width = 0;
  for (const auto& [key, value] : stats) width = std::max(width, key.size());
  for (const auto& [key, value] : stats) {
    const std::string shown = value.kind == Value::Kind::Number ? std::to_string(value.number)
                                                                : value.text;
    printf("%-*s  %s\n", static_cast<int>(width), key.c_str(), shown.c_str());
  }
  return exit_ok;
}

int verb_namespaces(ReadSource& source, const ReadOptions& o) {
  const std::vector<Record> list = source.namespaces();
  if (o.json) return printf("{\"namespaces\":%s}\n", json_of(list).c_str()), exit_ok;
  std::vector<std::vector<std::string>> rows;
  for (const Record& n : list) {
    rows.push_back({short_hex(text_of(n, "id")), count(n, "block_tokens"),
                    format_bytes(number_of(n, "block_payload_bytes")),
                    flag_of(n, "snapshot_required") ? "yes" : "no", count(n, "blocks"),
                    count(n, "snapshots"), format_bytes(number_of(n, "host_bytes")),
                    format_bytes(number_of(n, "disk_bytes"))});
  }
  fputs(render_table({{"NAMESPACE", false, true, 12}, {"BLOCK", true}, {"BLOCK SIZE", true},
                      {"SNAP-REQ"}, {"BLOCKS", true}, {"SNAPSHOTS", true}, {"HOST", true},
                      {"DISK", true}},
                     rows, table_width(o.full))
            .c_str(),
        stdout);
  printf("\n%zu namespaces.\n", list.size());
  return exit_ok;
}

int verb_list(ReadSource& source, const ReadOptions& o) {
  const EntryPage page = source.entries(o.query);
  if (o.json) {
    printf("{\"total\":%llu,\"offset\":%llu,\"limit\":%llu,\"entries\":%s}\n",
           (unsigned long long)page.total, (unsigned long long)o.query.offset,
           (unsigned long long)o.query.limit, json_of(page.entries).c_str());
    return exit_ok;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Record& e : page.entries) rows.push_back(entry_row(e));
  fputs(render_table({{"ID", true}, {"NAMESPACE", false, true, 6}, {"KIND"}, {"TIER"}, {"CLASS"},
                      {"POS", true}, {"SIZE", true}, {"HITS", true}, {"IDLE", true},
                      {"LEASES", true}, {"PIN"}, {"KEY", false, true, 6}},
                     rows, table_width(o.full))
            .c_str(),
        stdout);
  printf("\n%zu of %llu entries listed", page.entries.size(), (unsigned long long)page.total);
  if (o.query.offset + page.entries.size() < page.total) {
    printf(" (--offset %llu for more)", (unsigned long long)(o.query.offset + page.entries.size()));
  }
  printf(".\n");
  return exit_ok;
}

int verb_show(ReadSource& source, const ReadOptions& o, uint64_t id) {
  const Record e = source.entry(id);
  if (o.json) return printf("%s\n", json_of(e).c_str()), exit_ok;
  const std::pair<const char*, std::string> lines[] = {
      {"Id", text_of(e, "id")},
      {"Namespace", text_of(e, "namespace")},
      {"Kind", text_of(e, "kind")},
      {"Key", text_of(e, "key_hash")},
      {"Tier", text_of(e, "tier")},
      {"Class", text_of(e, "class")},
      {"Evidence", text_of(e, "evidence")},
      {"Position", count(e, "position") + " tokens (" + count(e, "tail_tokens") + " in the tail)"},
      {"Size", format_bytes(number_of(e, "bytes")) + " (" + count(e, "bytes") + " bytes)"},
      {"Hits", count(e, "hits")},
      {"Idle", format_duration_usec(number_of(e, "idle_usec"))},
      {"Session", text_of(e, "creator_session")},
      {"Leases", count(e, "leases")},
      {"Pinned", flag_of(e, "pinned") ? "yes" : "no"},
  };
  for (const auto& [label, value] : lines) printf("%10s: %s\n", label, value.c_str());
  return exit_ok;
}

}  // namespace kvpark::ctl
