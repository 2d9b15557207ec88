// JSONL trace parsing (see trace.h). RapidJSON is the foreign boundary here.
#include "bench/replay/trace.h"

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <sstream>

namespace kvpark::replay {
namespace {

constexpr uint32_t engines_max = 64;

bool parse_line(const std::string& line, Event& ret, std::string& ret_error) {
  rapidjson::Document doc;
  doc.Parse(line.c_str(), line.size());
  if (doc.HasParseError()) {
    ret_error = rapidjson::GetParseError_En(doc.GetParseError());
    return false;
  }
  if (!doc.IsObject()) return ret_error = "expected an object", false;
  if (!doc.HasMember("t_ms") || !doc["t_ms"].IsNumber() || doc["t_ms"].GetDouble() < 0) {
    return ret_error = "t_ms: expected a number >= 0", false;
  }
  Event e;
  e.t_ms = doc["t_ms"].GetDouble();
  auto engine_of = [&](const char* key) {
    if (!doc[key].IsUint() || doc[key].GetUint() >= engines_max) {
      ret_error = std::string(key) + ": expected an engine index below " + std::to_string(engines_max);
      return false;
    }
    e.engine = doc[key].GetUint();
    return true;
  };
  if (doc.HasMember("restart_engine")) {
    e.kind = EventKind::RestartEngine;
    if (!engine_of("restart_engine")) return false;
  } else if (doc.HasMember("restart_daemon")) {
    if (!doc["restart_daemon"].IsBool() || !doc["restart_daemon"].GetBool()) {
      return ret_error = "restart_daemon: expected true", false;
    }
    e.kind = EventKind::RestartDaemon;
  } else {
    e.kind = EventKind::Request;
    if (!doc.HasMember("engine") || !engine_of("engine")) {
      if (ret_error.empty()) ret_error = "engine: missing";
      return false;
    }
    if (!doc.HasMember("conversation") || !doc["conversation"].IsString()) {
      return ret_error = "conversation: expected a string", false;
    }
    e.conversation = doc["conversation"].GetString();
    if (!doc.HasMember("body") || !doc["body"].IsObject()) {
      return ret_error = "body: expected an object", false;
    }
    rapidjson::StringBuffer buffer;
    rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
    doc["body"].Accept(writer);
    e.body.assign(buffer.GetString(), buffer.GetSize());
    if (doc.HasMember("stats")) {
      if (!doc["stats"].IsBool()) return ret_error = "stats: expected a boolean", false;
      e.stats = doc["stats"].GetBool();
    }
  }
  ret = std::move(e);
  return true;
}

}  // namespace

bool parse_trace(const std::string& text, std::vector<Event>& ret_events, std::string& ret_error) {
  std::vector<Event> events;
  std::istringstream in(text);
  std::string line;
  size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Event e;
    std::string why;
    if (!parse_line(line, e, why)) {
      ret_error = "line " + std::to_string(number) + ": " + why;
      return false;
    }
    if (!events.empty() && e.t_ms < events.back().t_ms) {
      ret_error = "line " + std::to_string(number) + ": t_ms decreases";
      return false;
    }
    events.push_back(std::move(e));
  }
  ret_events = std::move(events);
  return true;
}

}  // namespace kvpark::replay
