// kvparkd's status, described once: every field of StatusInfo with its wire name, its
// unit, and how each door shows it. /v1/status (http_adapter.cpp) and D-Bus Status()
// (dbus_adapter.cpp) carry every field under its key, D-Bus Stats() the numbers among
// them; /metrics writes each field that names a metric (families in the order they
// first appear, each sample with its labels); a field with a D-Bus property name is a
// property too. kvparkctl reads the same keys (ctl/read_verbs.cpp). Adding a field is
// one StatusInfo member, where it is filled (control_plane.cpp), and one row here.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "daemon/control.h"

namespace kvpark::daemon {

enum class StatusUnit : uint8_t {
  count,             // a number of things or events
  bytes,
  usec,              // a duration, microseconds
  bytes_per_second,
  id,                // an opaque 64-bit id: hex text in JSON, a number over D-Bus
  flag,              // true or false; 1 or 0 in /metrics
  text,
};

// How a field shows in /metrics; metric nullptr: not there.
struct MetricSample {
  const char* metric = nullptr;  // the family's name
  const char* type = "gauge";    // gauge | counter
  const char* help = "";         // the family's HELP, from its first sample
  const char* labels = "";       // this sample's, within the family (`kind="block"`)
  bool seconds = false;          // a usec field shown as seconds
};

using StatusMember =
    std::variant<uint64_t StatusInfo::*, bool StatusInfo::*, std::string StatusInfo::*>;

struct StatusField {
  const char* key;  // the wire name: /v1/status, D-Bus Status() and Stats(), kvparkctl
  StatusMember member;
  StatusUnit unit;
  MetricSample metric{};
  bool remote_only = false;             // in /metrics only while the remote tier is on
  const char* dbus_property = nullptr;  // also a D-Bus property of this name
};

// A latency histogram of status: its JSON figures' key prefix (nullptr: /metrics only)
// and its /metrics family.
using StatusHistogramMember =
    std::variant<DiskLatencyHistogram StatusInfo::*, RemoteLatencyHistogram StatusInfo::*>;
struct StatusHistogram {
  const char* key;  // `<key>_timed`, `<key>_usec_p50`...: append_latency_figures
  StatusHistogramMember member;
  const char* metric;
  const char* help;
  bool remote_only = false;
};

std::span<const StatusField> status_fields();
std::span<const StatusHistogram> status_histograms();

// A field's value as a number (flags 1 or 0; text fields have none: 0).
uint64_t status_number(const StatusInfo& s, const StatusField& f);
// Each JSON / D-Bus figure of the histograms that have a key, in table order.
std::vector<std::pair<std::string, uint64_t>> status_histogram_figures(const StatusInfo& s);

}  // namespace kvpark::daemon
