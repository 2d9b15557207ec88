// Hosts A and B of the remote tier's process tests: a kvparkd each, with its own
// arena, disk directory and HTTP status port, over one store; and the store's keys.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <rapidjson/document.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/daemon_process.h"
#include "tests/testing/redis_process.h"

namespace kvpark::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A scratch directory, removed afterwards.
struct ScratchDirectory {
  ScratchDirectory() {
    char templ[] = "/var/tmp/kvpark-remote-test-XXXXXX";
    path = mkdtemp(templ);
  }
  ~ScratchDirectory() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

// One host: a kvparkd with its own arena, disk directory and HTTP status port (and on
// the session bus when `dbus`: tests that drive kvparkctl start a private one).
struct Host {
  explicit Host(const std::string& seeds, const std::string& label,
                const std::string& write_policy = "shared", bool dbus = false) {
    std::vector<std::string> args = {"--remote",   seeds,     "--remote-write", write_policy,
                                     "--disk-dir", disk.path, "--http-listen",  "127.0.0.1:0"};
    if (dbus) args.insert(args.end(), {"--dbus", "session"});
    daemon = std::make_unique<DaemonProcess>(
        DaemonConfig{.arena_bytes = 32ull << 20, .extra_args = args, .label = label});
  }
  // A page of the HTTP port ("" unless it answered 200).
  std::string get(const char* path) const {
    httplib::Client http("127.0.0.1", daemon->http_port());
    auto res = http.Get(path);
    return res && res->status == 200 ? res->body : "";
  }
  // A number from /v1/status (0 when absent; a flag as 0 or 1).
  uint64_t status(const std::string& key) const {
    rapidjson::Document d;
    d.Parse(get("/v1/status").c_str());
    if (d.HasParseError() || !d.HasMember(key.c_str())) return 0;
    const auto& v = d[key.c_str()];
    return v.IsUint64() ? v.GetUint64() : v.IsBool() ? (v.GetBool() ? 1 : 0) : 0;
  }
  // The same, failing the test when the number is not there (a renamed field must not
  // read as 0 to a test that expects 0).
  uint64_t status_required(const std::string& key) const {
    rapidjson::Document d;
    d.Parse(get("/v1/status").c_str());
    if (d.HasParseError() || !d.HasMember(key.c_str()) || !d[key.c_str()].IsUint64()) {
      ADD_FAILURE() << "no number '" << key << "' in /v1/status";
      return 0;
    }
    return d[key.c_str()].GetUint64();
  }
  std::string metrics() const { return get("/metrics"); }
  // Write-behinds finished, whatever their outcome.
  uint64_t writes_done() const {
    return status("remote_writes") + status("remote_writes_present") +
           status("remote_writes_failed");
  }
  ScratchDirectory disk;
  std::unique_ptr<DaemonProcess> daemon;
};

// Every key of the remote tier on every running node: (node, key).
inline std::vector<std::pair<size_t, std::string>> remote_keys(RedisCluster& cluster) {
  std::vector<std::pair<size_t, std::string>> keys;
  for (size_t n = 0; n < cluster.size(); ++n) {
    if (!cluster.node(n).running()) continue;
    std::istringstream lines(cluster.node(n).cli({"KEYS", "kvpark:r1:*"}));
    for (std::string k; std::getline(lines, k);) {
      if (!k.empty()) keys.emplace_back(n, k);
    }
  }
  return keys;
}

}  // namespace kvpark::testing
