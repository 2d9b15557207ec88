// Replay traces: JSONL, one event per line (docs/replay.md, "Trace format").
//   {"t_ms": 0, "engine": 1, "conversation": "c1", "body": {...chat completions...}}
//   {"t_ms": 900, "restart_engine": 1}
//   {"t_ms": 950, "restart_daemon": true}
// t_ms is the arrival in modeled milliseconds from the trace start; events are
// replayed in file order (t_ms must not decrease). A request may add
// "stats": true to have the daemon's counters read just before and after it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvpark::replay {

enum class EventKind : uint8_t { Request, RestartEngine, RestartDaemon };

struct Event {
  EventKind kind = EventKind::Request;
  double t_ms = 0;          // modeled milliseconds from the trace start
  uint32_t engine = 0;      // Request, RestartEngine
  std::string conversation; // Request
  std::string body;         // Request: the body as compact JSON
  bool stats = false;       // Request: read daemon stats around it
};

// Parses JSONL text. False with "line N: why" in ret_error.
bool parse_trace(const std::string& text, std::vector<Event>& ret_events, std::string& ret_error);

}  // namespace kvpark::replay
