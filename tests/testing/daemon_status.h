// One number of a running kvparkd's /v1/status (started with --http-listen), for the
// tests that watch its counters from outside, as an operator would.
#pragma once

#include <rapidjson/document.h>

#include <cstdint>
#include <string>

#include "tests/testing/daemon_process.h"
#include "tests/testing/openai_http.h"

namespace kvpark::testing {

// `key` of /v1/status; UINT64_MAX when the daemon does not answer or has no such number.
inline uint64_t daemon_status_number(const DaemonProcess& daemon, const char* key) {
  const HttpResult r =
      http_get("http://127.0.0.1:" + std::to_string(daemon.http_port()), "/v1/status");
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  return !d.HasParseError() && d.IsObject() && d.HasMember(key) && d[key].IsUint64()
             ? d[key].GetUint64()
             : UINT64_MAX;
}

}  // namespace kvpark::testing
