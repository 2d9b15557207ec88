// Scenario traces and their acceptance checks (see scenarios.h, docs/replay.md).
#include "bench/replay/scenarios.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "bench/replay/content.h"

namespace kvpark::replay {
namespace {

// Text of exactly `tokens` tokens under the replayer's tokenizer: words of one
// piece each, with a "." (one token) after every twelfth word.
std::string make_text(uint64_t seed, uint32_t tokens) {
  static const char* const letters = "abcdefghijklmnopqrstuvwxyz";
  std::string out;
  uint32_t made = 0, words = 0;
  while (made < tokens) {
    if (words > 0 && words % 12 == 0 && out.back() != '.') {
      out += ".";
      ++made;
      continue;
    }
    if (!out.empty()) out += ' ';
    uint64_t x = mix64(seed * 0x9e3779b97f4a7c15ull + words);
    const int length = 3 + int(x % 6);
    for (int i = 0; i < length; ++i, x /= 26) out += letters[x % 26];
    ++words;
    ++made;
  }
  return out;
}

struct Message {
  std::string role;
  std::string content;
};

struct Line {
  double t_ms = 0;
  int engine = 0;
  std::string conversation;
  std::vector<Message> messages;
  std::string tools_json;  // "" = none; else a JSON array, raw
  bool stats = false;
};

std::string request_line(const Line& l) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  w.StartObject();
  w.Key("t_ms");
  w.Double(l.t_ms);
  w.Key("engine");
  w.Int(l.engine);
  w.Key("conversation");
  w.String(l.conversation.c_str());
  if (l.stats) {
    w.Key("stats");
    w.Bool(true);
  }
  w.Key("body");
  w.StartObject();
  w.Key("model");
  w.String("replay-hybrid-27b");
  if (!l.tools_json.empty()) {
    w.Key("tools");
    w.RawValue(l.tools_json.c_str(), l.tools_json.size(), rapidjson::kArrayType);
  }
  w.Key("messages");
  w.StartArray();
  for (const Message& m : l.messages) {
    w.StartObject();
    w.Key("role");
    w.String(m.role.c_str());
    w.Key("content");
    w.String(m.content.c_str(), static_cast<rapidjson::SizeType>(m.content.size()));
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  w.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize()) + "\n";
}

std::string tools_json(uint64_t seed, int count, uint32_t description_tokens) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  w.StartArray();
  for (int i = 0; i < count; ++i) {
    const std::string name = "tool_" + std::to_string(i);
    const std::string description = make_text(seed + i, description_tokens);
    w.StartObject();
    w.Key("type");
    w.String("function");
    w.Key("function");
    w.StartObject();
    w.Key("name");
    w.String(name.c_str());
    w.Key("description");
    w.String(description.c_str());
    w.Key("parameters");
    w.StartObject();
    w.Key("type");
    w.String("object");
    w.EndObject();
    w.EndObject();
    w.EndObject();
  }
  w.EndArray();
  return std::string(buffer.GetString(), buffer.GetSize());
}

// A conversation that grows turn by turn.
struct Conversation {
  std::string id;
  std::vector<Message> messages;
  std::string tools;
  Line next(double t_ms, int engine, uint64_t seed, uint32_t user_tokens, uint32_t assistant_tokens = 0) {
    if (assistant_tokens > 0) messages.push_back({"assistant", make_text(seed ^ 0xa551, assistant_tokens)});
    messages.push_back({"user", make_text(seed, user_tokens)});
    return Line{.t_ms = t_ms, .engine = engine, .conversation = id, .messages = messages, .tools_json = tools};
  }
};

Conversation with_system(const std::string& id, uint64_t seed, uint32_t tokens) {
  Conversation c{.id = id};
  c.messages.push_back({"system", make_text(seed, tokens)});
  return c;
}

std::string restart_engine_line(double t_ms, int engine) {
  char line[96];
  snprintf(line, sizeof line, "{\"t_ms\":%.1f,\"restart_engine\":%d}\n", t_ms, engine);
  return line;
}

std::string restart_daemon_line(double t_ms) {
  char line[96];
  snprintf(line, sizeof line, "{\"t_ms\":%.1f,\"restart_daemon\":true}\n", t_ms);
  return line;
}


std::string fmt(const char* format, auto... args) {
  char buffer[512];
  snprintf(buffer, sizeof buffer, format, args...);
  return buffer;
}

void check(Verdict& v, bool ok, const std::string& what) {
  v.pass = v.pass && ok;
  v.checks.push_back(std::string(ok ? "PASS " : "FAIL ") + what);
}

// A comparison of timings measured on this machine: reported, never judged, since
// a slow or loaded machine may miss it without anything being wrong.
void report(Verdict& v, bool ok, const std::string& what) {
  v.checks.push_back(std::string(ok ? "met  " : "MISS ") + what + " (timing: not judged)");
}

// Checks every scenario shares: no request failed, every restore byte-identical.
void check_common(Verdict& v, const RunOutcome& o) {
  size_t failed = 0, differing = 0;
  std::string first_error;
  for (const RequestRecord& r : o.requests) {
    if (!r.done || r.result.failed) {
      ++failed;
      if (first_error.empty()) first_error = r.done ? r.result.error : "no result";
    }
    if (r.done && !r.result.byte_identical) ++differing;
  }
  check(v, failed == 0, fmt("%zu/%zu requests completed%s%s", o.requests.size() - failed, o.requests.size(),
                            first_error.empty() ? "" : ": ", first_error.c_str()));
  check(v, differing == 0, fmt("every restore byte-identical to the serial reference (%zu differ)", differing));
}

// (a) with blocks only, on one host or with the siblings on host B: B and C restore
// the head A prefilled (from B's store on one host, from the remote tier on two), and
// prefill none of it.
void judge_cross_host(const Scenario& s, const RunOutcome& o, const RunOptions& options, Verdict& v,
                      const RequestRecord& a, const RequestRecord& b, const RequestRecord& c) {
  auto pct = [](double x, double y) { return y > 0 ? 100.0 * x / y : 0.0; };
  const uint32_t head = b.reference.head_end;
  const uint32_t reused = b.result.cached_tokens + c.result.cached_tokens;
  v.figures = fmt("head %u; A %s prefill %u TTFT %.0f ms; B %s %u (%.1f%% of head), prefill %u, TTFT %.0f ms "
                  "(remote wait %.1f ms real); C %s %u, prefill %u, TTFT %.0f ms; reused %u tokens, "
                  "prefill avoided %.1f%% of B+C",
                  head, a.result.reuse_name(), a.result.prefill_tokens, a.result.ttft_ms, b.result.reuse_name(),
                  b.result.cached_tokens, pct(b.result.cached_tokens, head), b.result.prefill_tokens,
                  b.result.ttft_ms, b.result.remote_ms, c.result.reuse_name(), c.result.cached_tokens,
                  c.result.prefill_tokens, c.result.ttft_ms, reused,
                  pct(reused, b.result.prompt_tokens + c.result.prompt_tokens));
  for (const RequestRecord* r : {&b, &c}) {
    check(v, r->result.reuse_kind == KVPARK_REUSE_SHARED_STABLE_PREFIX && r->result.cached_tokens >= 0.99 * head,
          fmt("sibling %s restores >= 99%% of the head as shared_stable_prefix (%s, %.1f%%)",
              r == &b ? "B" : "C", r->result.reuse_name(), pct(r->result.cached_tokens, head)));
  }
  if (!s.two_hosts) return;
  const auto figure = [&](size_t host, const char* key) -> uint64_t {
    if (host >= o.host_status.size()) return 0;
    const auto it = o.host_status[host].find(key);
    return it == o.host_status[host].end() ? 0 : it->second;
  };
  v.figures += fmt("; store: A wrote %llu entries (%.1f MiB), B restored %llu (%.1f MiB) in %llu checks "
                   "(check p50 %llu us, restore p50 %llu us p99 %llu us); A's write-behinds settled %.0f ms real",
                   (unsigned long long)figure(0, "remote_writes"), double(figure(0, "remote_bytes_out")) / (1 << 20),
                   (unsigned long long)figure(1, "remote_hits"), double(figure(1, "remote_bytes_in")) / (1 << 20),
                   (unsigned long long)figure(1, "remote_probes"), (unsigned long long)figure(1, "remote_probe_usec_p50"),
                   (unsigned long long)figure(1, "remote_get_usec_p50"),
                   (unsigned long long)figure(1, "remote_get_usec_p99"), o.remote_settle_ms);
  const uint64_t head_blocks = head / options.engine.block_tokens;
  check(v, figure(1, "remote_hits") >= head_blocks * 99 / 100,
        fmt("host B brought the head from the remote tier (%llu entries for a head of %llu blocks), not from "
            "its own prefill",
            (unsigned long long)figure(1, "remote_hits"), (unsigned long long)head_blocks));
  check(v, figure(1, "remote_corrupt") == 0 && figure(1, "remote_rejected") == 0,
        fmt("nothing from the store was refused (corrupt %llu, rejected %llu)",
            (unsigned long long)figure(1, "remote_corrupt"), (unsigned long long)figure(1, "remote_rejected")));
}

}  // namespace

std::vector<std::string> scenario_names() { return {"a", "a-noauto", "b", "c", "d", "e", "f", "g"}; }

std::vector<std::string> cross_host_scenario_names() {
  return {"a", "a-remote", "a-blocks", "a-remote-blocks"};
}

bool make_scenario(const std::string& name, bool quick, Scenario& ret) {
  const double f = quick ? 0.5 : 1.0;
  auto tok = [&](uint32_t n) { return static_cast<uint32_t>(n * f); };
  Scenario s;
  s.name = name;
  std::string& t = s.trace;
  const bool remote = name == "a-remote" || name == "a-remote-blocks";
  if (name == "a" || name == "a-noauto" || name == "a-blocks" || remote) {
    s.title = name == "a-blocks"          ? "(a) with blocks only (no snapshots), one host"
              : name == "a-remote"        ? "(a) as shipped (hybrid), A on host A, the siblings on host B, one Redis"
              : name == "a-remote-blocks" ? "(a) with blocks only, A on host A, the siblings on host B, one Redis"
                                          : "two sibling sessions, 16k system head, no breakpoints";
    s.automatic_system_candidate = name != "a-noauto";
    s.snapshot_required = name != "a-blocks" && name != "a-remote-blocks";
    if (remote) {
      s.two_hosts = true;
      s.engine_host = {0, 1, 1};
    }
    // A and B are the sibling pair; C is a later sibling (what a capture hint buys).
    const char* ids[] = {"sibling-A", "sibling-B", "sibling-C"};
    for (int i = 0; i < 3; ++i) {
      Conversation c = with_system(ids[i], 1, tok(16'000));
      t += request_line(c.next(4000.0 * i * f, i, 100 + i, 150));
    }
  } else if (name == "b") {
    s.title = "the same conversation's next turn";
    Conversation c = with_system("conv-b", 2, tok(2'000));
    t += request_line(c.next(0, 0, 200, tok(1'500)));
    t += request_line(c.next(3000, 0, 201, 200, 400));
  } else if (name == "c") {
    s.title = "six sub-agents fanned out over a shared ~9k head";
    const std::string tools = tools_json(30, 12, tok(110));
    for (int i = 0; i < 6; ++i) {
      Conversation c = with_system("agent-" + std::to_string(i), 3, tok(7'500));
      c.tools = tools;
      t += request_line(c.next(1.0 * i, i, 300 + i, tok(600 + 250 * i)));
    }
  } else if (name == "d") {
    s.title = "interleaved conversations (10k, 5k, 26k), alternating turns";
    Conversation conv[3] = {with_system("conv-10k", 41, 400), with_system("conv-5k", 42, 400),
                            with_system("conv-26k", 43, 400)};
    const uint32_t first_user[3] = {tok(9'000), tok(4'000), tok(25'000)};
    double at = 0;
    for (int round = 0; round < 3; ++round) {
      for (int k = 0; k < 3; ++k) {
        t += request_line(round == 0 ? conv[k].next(at, 0, 400 + k, first_user[k])
                                     : conv[k].next(at, 0, 400 + 10 * round + k, 200, 300));
        at += 5000 * f;
      }
    }
  } else if (name == "e") {
    s.title = "three 32k private conversations, then a return to the first (arena < 3x, disk on)";
    s.arena_bytes = 24ull << 20;
    s.disk = true;
    s.time_scale_min = 1.0;
    Conversation conv[3] = {with_system("private-1", 51, 200), with_system("private-2", 52, 200),
                            with_system("private-3", 53, 200)};
    for (int k = 0; k < 3; ++k) t += request_line(conv[k].next(6000.0 * k, 0, 500 + k, 32'000));
    Line back = conv[0].next(20'000, 0, 510, 200, 300);
    back.stats = true;
    t += request_line(back);
  } else if (name == "f") {
    s.title = "an engine restart mid-trace";
    Conversation c = with_system("conv-f1", 6, tok(4'000));
    t += request_line(c.next(0, 0, 600, tok(1'000)));
    t += request_line(c.next(3000, 0, 601, 200, 300));
    t += restart_engine_line(6000, 0);
    t += request_line(c.next(6500, 0, 602, 200, 300));
    Conversation sibling = with_system("conv-f2", 6, tok(4'000));
    t += request_line(sibling.next(9500, 0, 610, 300));
  } else if (name == "g") {
    s.title = "a daemon restart mid-trace (SIGKILL), disk tier on";
    s.disk = true;
    Conversation g1 = with_system("conv-g1", 7, tok(8'000));
    Conversation g2 = with_system("conv-g2", 7, tok(8'000));
    Conversation g3 = with_system("conv-g3", 7, tok(8'000));
    t += request_line(g1.next(0, 0, 700, tok(1'000)));
    t += request_line(g2.next(3000, 1, 701, tok(1'000)));
    t += restart_daemon_line(6000);
    t += request_line(g1.next(6500, 0, 702, 200, 300));
    t += request_line(g3.next(9500, 1, 703, 300));
  } else {
    return false;
  }
  ret = std::move(s);
  return true;
}

Verdict judge(const Scenario& s, const RunOutcome& o, const RunOptions& options) {
  Verdict v;
  if (!o.ok) {
    check(v, false, "the run failed: " + o.error);
    return v;
  }
  check_common(v, o);
  const std::vector<RequestRecord>& rq = o.requests;
  const double rate = options.engine.prefill_tokens_per_second;
  // Requests by conversation, in trace order (the conversation id is in the rendered order).
  std::map<std::string, std::vector<const RequestRecord*>> by_conversation;
  std::vector<Event> events;
  std::string error;
  parse_trace(s.trace, events, error);
  for (const RequestRecord& r : rq) by_conversation[events[r.event].conversation].push_back(&r);
  auto pct = [](double a, double b) { return b > 0 ? 100.0 * a / b : 0.0; };

  if (s.name == "a-blocks" || s.name == "a-remote" || s.name == "a-remote-blocks") {
    judge_cross_host(s, o, options, v, *by_conversation["sibling-A"][0], *by_conversation["sibling-B"][0],
                     *by_conversation["sibling-C"][0]);
  } else if (s.name == "a" || s.name == "a-noauto") {
    const RequestRecord& a = *by_conversation["sibling-A"][0];
    const RequestRecord& b = *by_conversation["sibling-B"][0];
    const RequestRecord& c = *by_conversation["sibling-C"][0];
    const uint32_t head = b.reference.head_end;
    v.figures = fmt("head %u; A %s %u/%u TTFT %.0f ms; B %s %u (%.1f%% of head) TTFT %.0f ms%s; "
                    "C %s %u TTFT %.0f ms",
                    head, a.result.reuse_name(), a.result.cached_tokens, a.result.prompt_tokens,
                    a.result.ttft_ms, b.result.reuse_name(), b.result.cached_tokens,
                    pct(b.result.cached_tokens, head), b.result.ttft_ms,
                    b.result.hint_captured ? fmt(", hint %u captured", b.result.capture_hint).c_str() : "",
                    c.result.reuse_name(), c.result.cached_tokens, c.result.ttft_ms);
    if (s.automatic_system_candidate) {
      check(v, b.result.reuse_kind == KVPARK_REUSE_SHARED_STABLE_PREFIX && b.result.cached_tokens >= 0.99 * head,
            fmt("sibling B restores >= 99%% of the head as shared_stable_prefix (%s, %.1f%%)",
                b.result.reuse_name(), pct(b.result.cached_tokens, head)));
    } else {
      check(v, b.result.reuse_kind == KVPARK_REUSE_ROOT,
            fmt("with the automatic candidate off, sibling B is root (%s)", b.result.reuse_name()));
    }
  } else if (s.name == "b") {
    const auto& turns = by_conversation["conv-b"];
    const RequestRecord& one = *turns[0];
    const RequestRecord& two = *turns[1];
    v.figures = fmt("turn 1 %u tokens cold TTFT %.0f ms; turn 2 %s %u/%u TTFT %.0f ms",
                    one.result.prompt_tokens, one.result.ttft_ms, two.result.reuse_name(),
                    two.result.cached_tokens, two.result.prompt_tokens, two.result.ttft_ms);
    check(v, two.result.reuse_kind == KVPARK_REUSE_PRIVATE_TURN_CLOSURE &&
                 two.result.cached_tokens >= 0.95 * one.result.prompt_tokens,
          fmt("the next turn restores >= 95%% of the previous turn as private_turn_closure (%s, %.1f%%)",
              two.result.reuse_name(), pct(two.result.cached_tokens, one.result.prompt_tokens)));
  } else if (s.name == "c") {
    std::vector<const RequestRecord*> streams;
    for (const RequestRecord& r : rq) streams.push_back(&r);
    const uint32_t head = streams[0]->reference.head_end;
    uint64_t prefill = 0, deltas = 0;
    double wall = 0, sequential = 0;
    const double first_t = events[streams[0]->event].t_ms;
    size_t led = 0, followed = 0;
    for (size_t i = 0; i < streams.size(); ++i) {
      const RequestRecord& r = *streams[i];
      prefill += r.result.prefill_tokens;
      deltas += r.reference.tokens.size() - head;
      wall = std::max(wall, events[r.event].t_ms - first_t + r.result.ttft_ms);
      led += r.result.led;
      followed += r.result.followed;
      // One after another with prefix sharing: the first from the root, each later one
      // restores the head (at the restore time measured here) and prefills its delta.
      const double tokens = i == 0 ? double(r.reference.tokens.size()) : double(r.reference.tokens.size() - head);
      sequential += (i == 0 ? 0.0 : r.result.restore_ms) + tokens * 1000.0 / rate;
    }
    const double bound = 1.05 * double(head + deltas);
    v.figures = fmt("head %u; prefill %llu tokens vs bound %.0f (head + deltas %llu); %zu led, %zu followed; "
                    "fan-out wall %.0f ms vs sequential-with-sharing %.0f ms",
                    head, (unsigned long long)prefill, bound, (unsigned long long)(head + deltas), led, followed,
                    wall, sequential);
    check(v, double(prefill) <= bound, fmt("total prefill %llu <= 1.05 x (head once + deltas) = %.0f",
                                           (unsigned long long)prefill, bound));
    report(v, wall <= sequential, fmt("fan-out wall %.0f ms <= sequential with sharing %.0f ms", wall, sequential));
  } else if (s.name == "d") {
    std::string worst;
    double worst_pct = 101;
    size_t switches = 0;
    bool all = true;
    for (const auto& [id, turns] : by_conversation) {
      for (size_t k = 1; k < turns.size(); ++k) {
        const double p = pct(turns[k]->result.cached_tokens, turns[k - 1]->result.prompt_tokens);
        ++switches;
        all = all && p >= 95.0;
        if (p < worst_pct) {
          worst_pct = p;
          worst = id;
        }
      }
    }
    double ttft_sum = 0;
    for (const RequestRecord& r : rq) ttft_sum += r.result.ttft_ms;
    v.figures = fmt("%zu switches back; worst restores %.1f%% of its conversation (%s); sum TTFT %.0f ms",
                    switches, worst_pct, worst.c_str(), ttft_sum);
    check(v, all, fmt("every switch back restores >= 95%% of that conversation (worst %.1f%%)", worst_pct));
  } else if (s.name == "e") {
    const auto& p1 = by_conversation["private-1"];
    const RequestRecord& first = *p1[0];
    const RequestRecord& back = *p1[1];
    const uint64_t promotions = back.has_stats ? back.stats_after.promotions - back.stats_before.promotions : 0;
    v.figures = fmt("return %s %u/%u (%.1f%% of conv 1) TTFT %.0f ms (promote wait %.0f ms); promotions %llu; "
                    "daemon: spills %llu, disk entries %llu, evictions %llu",
                    back.result.reuse_name(), back.result.cached_tokens, back.result.prompt_tokens,
                    pct(back.result.cached_tokens, first.result.prompt_tokens), back.result.ttft_ms,
                    back.result.promote_ms, (unsigned long long)promotions,
                    (unsigned long long)o.final_stats.spills, (unsigned long long)o.final_stats.disk_entries,
                    (unsigned long long)o.final_stats.evictions);
    // What the daemon offers (restored, or promoting when a slow machine gave up
    // waiting) is judged; how much of it arrived in time is a figure.
    const uint32_t offered = back.result.cached_tokens + back.result.promoting_tokens;
    check(v, back.has_stats && (promotions > 0 || back.result.promoting_tokens > 0),
          fmt("the return restores from disk (promotions %llu, %u tokens still promoting)",
              (unsigned long long)promotions, back.result.promoting_tokens));
    check(v, offered >= 0.95 * first.result.prompt_tokens,
          fmt("the return is offered >= 95%% of conversation 1 (%.1f%%; %.1f%% restored in time)",
              pct(offered, first.result.prompt_tokens),
              pct(back.result.cached_tokens, first.result.prompt_tokens)));
  } else if (s.name == "f" || s.name == "g") {
    size_t after = 0, short_of = 0, gave_up = 0;
    uint64_t expected = 0, cached = 0;
    for (const RequestRecord& r : rq) {
      if (!(s.name == "f" ? r.after_engine_restart : r.after_daemon_restart)) continue;
      ++after;
      expected += r.reference.tokens.size() > 0 ? r.expected_cached : 0;
      cached += r.result.cached_tokens;
      // Judged: the daemon offered it (restored, or promoting from disk when a slow
      // machine ran out of the wait the prefill time allows).
      const uint32_t offered = r.result.cached_tokens + r.result.promoting_tokens;
      if (offered < r.expected_cached || r.expected_cached == 0) ++short_of;
      if (r.result.promoting_tokens > 0) ++gave_up;
    }
    v.figures = fmt("%zu requests after the restart restore %llu tokens of %llu parked before it"
                    "%s",
                    after, (unsigned long long)cached, (unsigned long long)expected,
                    gave_up > 0 ? fmt(" (%zu gave up on a slow promotion)", gave_up).c_str() : "");
    if (s.name == "g") {
      v.figures += fmt("; disk entries %llu before the kill (%llu written through), %llu recovered",
                       (unsigned long long)o.disk_entries_before_kill,
                       (unsigned long long)o.durable_entries_expected,
                       (unsigned long long)o.disk_entries_after_restart);
      check(v, o.disk_entries_after_restart >= o.disk_entries_before_kill && o.disk_entries_before_kill > 0,
            "recovery found every record that had reached disk");
    }
    check(v, after > 0 && short_of == 0,
          fmt("nothing parked%s is prefilled again (%zu of %zu requests short)",
              s.name == "g" ? " on disk" : "", short_of, after));
  }
  return v;
}

}  // namespace kvpark::replay
