// kvparkctl over org.kvpark.Park1 (see bus.h).
#include "ctl/bus.h"

#include <sdbus-c++/sdbus-c++.h>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "ctl/failure.h"
#include "proto/dbus_api.h"

namespace kvpark::ctl {
namespace {

using Dict = std::map<std::string, sdbus::Variant>;

int exit_code_for(const std::string& error_name) {
  if (error_name == dbus_api::error_not_found) return exit_not_found;
  if (error_name == dbus_api::error_permission_denied ||
      error_name == "org.freedesktop.DBus.Error.AccessDenied" ||
      error_name == "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired") {
    return exit_permission_denied;
  }
  if (error_name == dbus_api::error_invalid_argument) return exit_usage;
  if (error_name == dbus_api::error_unavailable) return exit_unavailable;
  return exit_failure;
}

// Errors that mean kvparkd is not on this bus (or the bus went away), as opposed
// to an answer from kvparkd.
bool means_unreachable(const std::string& error_name) {
  return error_name == "org.freedesktop.DBus.Error.ServiceUnknown" ||
         error_name == "org.freedesktop.DBus.Error.NameHasNoOwner" ||
         error_name == "org.freedesktop.DBus.Error.NoReply" ||
         error_name == "org.freedesktop.DBus.Error.Disconnected" ||
         error_name.rfind("System.Error.", 0) == 0;  // sd-bus: the socket is not there
}

Record record_of(const Dict& d) {
  Record r;
  for (const auto& [key, v] : d) {
    if (v.containsValueOfType<std::string>())
      r[key] = Value::of_text(v.get<std::string>());
    else if (v.containsValueOfType<uint64_t>())
      r[key] = Value::of_number(v.get<uint64_t>());
    else if (v.containsValueOfType<uint32_t>())
      r[key] = Value::of_number(v.get<uint32_t>());
    else if (v.containsValueOfType<bool>())
      r[key] = Value::of_flag(v.get<bool>());
  }
  return r;
}

bool name_reachable(sdbus::IConnection& bus) {
  auto driver = sdbus::createProxy(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus");
  bool has_owner = false;
  driver->callMethod("NameHasOwner")
      .onInterface("org.freedesktop.DBus")
      .withArguments(std::string(dbus_api::bus_name))
      .storeResultsTo(has_owner);
  if (has_owner) return true;
  std::vector<std::string> activatable;
  driver->callMethod("ListActivatableNames")
      .onInterface("org.freedesktop.DBus")
      .storeResultsTo(activatable);
  for (const std::string& n : activatable) {
    if (n == dbus_api::bus_name) return true;
  }
  return false;
}

class DbusBus final : public Bus {
 public:
  DbusBus(std::unique_ptr<sdbus::IConnection> connection, std::string bus_label)
      : connection_(std::move(connection)),
        bus_label_(std::move(bus_label)),
        proxy_(sdbus::createProxy(*connection_, dbus_api::bus_name, dbus_api::object_path)) {}

  template <typename... Results, typename... Args>
  void call(const char* method, std::tuple<Results&...> results, Args&&... args) {
    try {
      std::apply(
          [&](auto&... r) {
            proxy_->callMethod(method)
                .onInterface(dbus_api::interface_name)
                .withArguments(std::forward<Args>(args)...)
                .storeResultsTo(r...);
          },
          results);
    } catch (const sdbus::Error& e) {
      failed(e);
    }
  }
  template <typename... Args>
  void call_void(const char* method, Args&&... args) {
    try {
      proxy_->callMethod(method)
          .onInterface(dbus_api::interface_name)
          .withArguments(std::forward<Args>(args)...);
    } catch (const sdbus::Error& e) {
      failed(e);
    }
  }

  std::unique_ptr<ReadSource> read_source() override;

  void set_pinned(uint64_t id, bool pinned) override { call_void(pinned ? "Pin" : "Unpin", id); }
  void evict(uint64_t id) override { call_void("Evict", id); }
  uint64_t start_flush() override {
    uint64_t job = 0;
    call("Flush", std::tie(job));
    return job;
  }
  Record flush_progress(uint64_t job) override {
    Dict p;
    call("GetFlushProgress", std::tie(p), job);
    return progress_from_dbus(record_of(p));
  }
  uint64_t drop_namespace(const std::string& namespace_hex) override {
    uint64_t dropped = 0;
    call("DropNamespace", std::tie(dropped), namespace_hex);
    return dropped;
  }
  void set_limit(const std::string& name, uint64_t value) override {
    call_void("SetLimit", name, value);
  }
  std::string reload() override {
    std::string message;
    call("Reload", std::tie(message));
    return message;
  }

 private:
  [[noreturn]] void failed(const sdbus::Error& e) {
    if (means_unreachable(e.getName())) {
      throw Unreachable{"kvparkd is not on the " + bus_label_ + " bus (" + e.getName() + ": " +
                        e.getMessage() + ")"};
    }
    fail(exit_code_for(e.getName()), e.getMessage());
  }

  std::unique_ptr<sdbus::IConnection> connection_;
  std::string bus_label_;
  std::unique_ptr<sdbus::IProxy> proxy_;
};

class DbusReadSource final : public ReadSource {
 public:
  explicit DbusReadSource(DbusBus& bus) : bus_(bus) {}

  Record status() override {
    Dict s;
    bus_.call("Status", std::tie(s));
    return status_from_dbus(record_of(s));
  }
  std::vector<Record> namespaces() override {
    std::vector<Dict> list;
    bus_.call("ListNamespaces", std::tie(list));
    std::vector<Record> out;
    for (const Dict& d : list) out.push_back(record_of(d));
    return out;
  }
  EntryPage entries(const EntryQuery& q) override {
    Dict filter{{"limit", sdbus::Variant(q.limit)}, {"offset", sdbus::Variant(q.offset)}};
    if (!q.namespace_hex.empty()) filter["namespace"] = sdbus::Variant(q.namespace_hex);
    if (!q.tier.empty()) filter["tier"] = sdbus::Variant(q.tier);
    if (!q.entry_class.empty()) filter["class"] = sdbus::Variant(q.entry_class);
    std::vector<Dict> list;
    EntryPage page;
    bus_.call("ListEntries", std::tie(list, page.total), filter);
    for (const Dict& d : list) page.entries.push_back(entry_from_dbus(record_of(d)));
    return page;
  }
  Record entry(uint64_t id) override {
    Dict e;
    bus_.call("ShowEntry", std::tie(e), id);
    return entry_from_dbus(record_of(e));
  }
  const char* name() const override { return "D-Bus"; }

 private:
  DbusBus& bus_;
};

std::unique_ptr<ReadSource> DbusBus::read_source() {
  return std::make_unique<DbusReadSource>(*this);
}

}  // namespace

std::unique_ptr<Bus> Bus::open(BusChoice choice) {
  std::string system_note;
  if (choice != BusChoice::Session) {
    try {
      auto system = sdbus::createSystemBusConnection();
      if (choice == BusChoice::System || name_reachable(*system)) {
        return std::make_unique<DbusBus>(std::move(system), "system");
      }
      system_note = "org.kvpark.Park1 is not on the system bus, and ";
    } catch (const sdbus::Error& e) {
      if (choice == BusChoice::System) {
        throw Unreachable{"cannot open the system bus (" + e.getMessage() + ")"};
      }
      system_note = "no system bus, and ";
    }
  }
  try {
    return std::make_unique<DbusBus>(sdbus::createSessionBusConnection(), "session");
  } catch (const sdbus::Error& e) {
    throw Unreachable{system_note + "cannot open the session bus (" + e.getMessage() + ")"};
  }
}

}  // namespace kvpark::ctl
