// kvparkctl over org.kvpark.Park1 (proto/dbus_api.h): the bus, the read source and
// the commands. sdbus-c++ stays behind this header; its exceptions become
// Unreachable (no bus, or kvparkd not on it) or fail() with an exit code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ctl/record.h"
#include "ctl/source.h"

namespace kvpark::ctl {

enum class BusChoice : uint8_t { Auto, System, Session };

class Bus {
 public:
  // Opens the bus (Auto: the system bus when org.kvpark.Park1 is there or
  // activatable on it, else the session bus). Throws Unreachable.
  static std::unique_ptr<Bus> open(BusChoice choice);
  virtual ~Bus() = default;

  virtual std::unique_ptr<ReadSource> read_source() = 0;

  // Commands; each throws Unreachable or fails with the daemon's message.
  virtual void set_pinned(uint64_t id, bool pinned) = 0;
  virtual void evict(uint64_t id) = 0;
  virtual uint64_t start_flush() = 0;
  virtual Record flush_progress(uint64_t job) = 0;
  virtual uint64_t drop_namespace(const std::string& namespace_hex) = 0;
  virtual void set_limit(const std::string& name, uint64_t value) = 0;
  virtual std::string reload() = 0;
};

}  // namespace kvpark::ctl
