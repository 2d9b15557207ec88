// org.kvpark.Park1 on D-Bus (dbus_api.h): a thin translation layer over Control.
//
// The adapter owns one thread that runs the bus connection's event loop with
// poll(2): method calls, property reads, the MemoryPressure sampler and the
// FlushProgress poller all run there, so the sdbus objects are never shared
// between threads. Control marshals each call onto the daemon's event loop, so a
// slow call here never blocks engines. Mutating methods check the caller's
// credentials (effective uid from the bus, supplementary groups) before they
// reach Control: root, the daemon's own uid, or a member of the admin group.
//
// This header does not include sdbus-c++; the core never sees it.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "daemon/control.h"
#include "daemon/options.h"

namespace kvpark::daemon {

struct DbusAdapterOptions {
  DbusBus bus = DbusBus::Session;  // Off: do not call start()
  std::string admin_group = "kvpark-admin";  // members may call mutating methods
};

class DbusAdapter {
 public:
  // Connects, claims the bus name and starts the adapter thread. On failure
  // returns nullptr with a one-line reason in ret_error (the caller logs it).
  static std::unique_ptr<DbusAdapter> start(const DbusAdapterOptions& options, Control& control,
                                            std::string& ret_error);
  virtual ~DbusAdapter() = default;  // stops the thread and releases the name
};

// The privilege rule, separated for tests: root, `daemon_uid`, or a member of
// `admin_gid` (-1: no admin group) through the primary or a supplementary group.
bool caller_privileged(uid_t caller_euid, gid_t caller_gid, const gid_t* groups, size_t group_count,
                       uid_t daemon_uid, gid_t admin_gid);

}  // namespace kvpark::daemon
