// Where kvparkctl's read verbs get their records: kvparkd over D-Bus (ctl/bus.cpp)
// or, when no bus reaches it, its HTTP status API (ctl/http_source.cpp). Both give
// records in the JSON schema (ctl/record.h), so every verb prints the same either way.
//
// Failures: Unreachable (nothing printed; the caller may try the other source) when
// kvparkd cannot be reached this way, else fail() with the exit code (failure.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ctl/record.h"

namespace kvpark::ctl {

struct EntryQuery {
  std::string namespace_hex;  // 32 hex digits, or empty: every namespace
  std::string tier;           // "host", "disk" or empty
  std::string entry_class;    // "shared", "private" or empty
  uint64_t offset = 0;
  uint64_t limit = 0;
};

struct EntryPage {
  std::vector<Record> entries;
  uint64_t total = 0;  // matching entries before paging
};

class ReadSource {
 public:
  virtual ~ReadSource() = default;
  virtual Record status() = 0;
  virtual std::vector<Record> namespaces() = 0;
  virtual EntryPage entries(const EntryQuery& query) = 0;
  virtual Record entry(uint64_t id) = 0;
  virtual const char* name() const = 0;  // "D-Bus" or "HTTP"
};

// kvparkd's HTTP status API at "HOST:PORT" ("[v6]:PORT"); connects on first use.
std::unique_ptr<ReadSource> open_http_source(const std::string& address);

}  // namespace kvpark::ctl
