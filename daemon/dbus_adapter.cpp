// org.kvpark.Park1 over sdbus-c++ (see dbus_adapter.h and dbus_api.h).
//
// sdbus-c++ reports failures with exceptions; they are caught here, at the
// boundary: a method handler's failure becomes a D-Bus error reply, a broken bus
// ends the adapter thread with one log line while kvparkd keeps serving engines.
#include "daemon/dbus_adapter.h"

#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <sdbus-c++/sdbus-c++.h>
#include <set>
#include <thread>
#include <tuple>
#include <variant>

#include "daemon/clock.h"
#include "daemon/log.h"
#include "daemon/status_fields.h"
#include "proto/dbus_api.h"
#include "proto/names.h"

namespace kvpark::daemon {
namespace {

using Dict = std::map<std::string, sdbus::Variant>;

// The D-Bus error name for a Status (dbus_api.h lists them).
const char* error_name(Status s) {
  const char* name = dbus_api::error_failed;
  switch (s) {
    case Status::NotFound: name = dbus_api::error_not_found; break;
    case Status::PermissionDenied: name = dbus_api::error_permission_denied; break;
    case Status::BadState:
    case Status::InFlight:
    case Status::ArenaFull:
    case Status::LimitExceeded: name = dbus_api::error_bad_state; break;
    case Status::InvalidArgument: name = dbus_api::error_invalid_argument; break;
    case Status::Unavailable: name = dbus_api::error_unavailable; break;
    default: break;
  }
  return name;
}

[[noreturn]] void throw_status(Status s, const std::string& what) {
  throw sdbus::Error(error_name(s), what + ": " + std::string(status_name(s)));
}

// A refusal whose message already names its cause (Control's ret_message).
void check_explained(Status s, const std::string& message, const std::string& what) {
  if (s == Status::Ok) return;
  if (message.empty()) throw_status(s, what);
  throw sdbus::Error(error_name(s), message);
}

void check(Status s, const std::string& what) {
  if (s != Status::Ok) throw_status(s, what);
}

// Every status field under its key (status_fields.h), then the histograms' figures.
Dict status_dict(const StatusInfo& s) {
  Dict d;
  for (const StatusField& f : status_fields())
    std::visit([&](auto member) { d.emplace(f.key, sdbus::Variant(s.*member)); }, f.member);
  for (const auto& [key, value] : status_histogram_figures(s)) d.emplace(key, sdbus::Variant(value));
  return d;
}

std::map<std::string, uint64_t> stats_dict(const StatusInfo& s) {
  std::map<std::string, uint64_t> out;
  for (auto& [key, value] : status_dict(s)) {
    if (value.containsValueOfType<uint64_t>()) out[key] = value.get<uint64_t>();
  }
  return out;
}

Dict namespace_dict(const NamespaceSummary& n) {
  return {{"id", sdbus::Variant(hex128(n.id))},
          {"block_tokens", sdbus::Variant(n.geometry.block_tokens)},
          {"block_payload_bytes", sdbus::Variant(n.geometry.block_payload_bytes)},
          {"snapshot_required", sdbus::Variant(n.geometry.snapshot_required)},
          {"chain_tokens", sdbus::Variant(n.chain_tokens)},
          {"prefill_tokens_per_second", sdbus::Variant(n.prefill_tokens_per_second)},
          {"blocks", sdbus::Variant(n.blocks)},
          {"snapshots", sdbus::Variant(n.snapshots)},
          {"host_bytes", sdbus::Variant(n.host_bytes)},
          {"disk_bytes", sdbus::Variant(n.disk_bytes)},
          {"restorable_tokens", sdbus::Variant(n.restorable_tokens)},
          {"restored_tokens", sdbus::Variant(n.restored_tokens)}};
}

Dict entry_dict(const EntrySummary& e) {
  return {{"id", sdbus::Variant(e.id)},
          {"namespace", sdbus::Variant(hex128(e.namespace_id))},
          {"kind", sdbus::Variant(std::string(entry_kind_name(e.kind)))},
          {"tier", sdbus::Variant(std::string(tier_name(e.tier)))},
          {"key", sdbus::Variant(hex128(e.key_hash))},
          {"position", sdbus::Variant(e.position)},
          {"tail_tokens", sdbus::Variant(e.tail_tokens)},
          {"bytes", sdbus::Variant(e.bytes)},
          {"class", sdbus::Variant(std::string(entry_class_name(e.entry_class)))},
          {"evidence", sdbus::Variant(std::string(evidence_name(e.evidence)))},
          {"hits", sdbus::Variant(e.hits)},
          {"idle_usec", sdbus::Variant(e.idle_usec)},
          {"creator_session", sdbus::Variant(e.creator_session)},
          {"leases", sdbus::Variant(e.leases)},
          {"pinned", sdbus::Variant(e.pinned)}};
}

Dict progress_dict(const FlushProgress& p) {
  return {{"job", sdbus::Variant(p.job_id)},
          {"done", sdbus::Variant(p.done)},
          {"status", sdbus::Variant(std::string(status_name(p.status)))},
          {"entries_done", sdbus::Variant(p.entries_done)},
          {"entries_total", sdbus::Variant(p.entries_total)},
          {"bytes_done", sdbus::Variant(p.bytes_done)},
          {"bytes_total", sdbus::Variant(p.bytes_total)}};
}

EntryFilter parse_filter(const Dict& in) {
  EntryFilter f;
  f.limit = dbus_api::entries_page_default;
  auto bad = [](const std::string& why) -> void {
    throw sdbus::Error(dbus_api::error_invalid_argument, why);
  };
  for (const auto& [key, value] : in) {
    if (key == "namespace" && value.containsValueOfType<std::string>()) {
      Hash128 id;
      if (!parse_hex128(value.get<std::string>(), id)) bad("namespace: not a hex id");
      f.namespace_id = id;
    } else if (key == "tier" && value.containsValueOfType<std::string>()) {
      Tier tier = Tier::Both;
      if (!parse_tier(value.get<std::string>(), tier) || tier == Tier::Both) {
        bad("tier: expected host or disk");
      }
      f.tier = tier;
    } else if (key == "class" && value.containsValueOfType<std::string>()) {
      EntryClass entry_class = EntryClass::Private;
      if (!parse_entry_class(value.get<std::string>(), entry_class)) {
        bad("class: expected shared or private");
      }
      f.entry_class = entry_class;
    } else if (key == "offset" && value.containsValueOfType<uint64_t>()) {
      f.offset = value.get<uint64_t>();
    } else if (key == "limit" && value.containsValueOfType<uint64_t>()) {
      f.limit = value.get<uint64_t>();
      if (f.limit == 0 || f.limit > dbus_api::entries_page_max) bad("limit: 1.." +
          std::to_string(dbus_api::entries_page_max));
    } else {
      bad("unknown filter key or wrong type: " + key);
    }
  }
  return f;
}

class DbusAdapterImpl final : public DbusAdapter {
 public:
  DbusAdapterImpl(const DbusAdapterOptions& options, Control& control)
      : control_(control), stop_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (const group* g = getgrnam(options.admin_group.c_str()); g != nullptr) {
      admin_gid_ = g->gr_gid;
    }
  }

  ~DbusAdapterImpl() override {
    const uint64_t one = 1;
    (void)write(stop_fd_, &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    object_.reset();
    connection_.reset();
    close(stop_fd_);
  }

  // Throws sdbus::Error when the bus or the name cannot be had.
  void connect(DbusBus bus) {
    connection_ = bus == DbusBus::System
                      ? sdbus::createSystemBusConnection(dbus_api::bus_name)
                      : sdbus::createSessionBusConnection(dbus_api::bus_name);
    object_ = sdbus::createObject(*connection_, dbus_api::object_path);
    register_members();
    thread_ = std::thread([this] { run(); });
  }

 private:
  void register_members();
  void run();
  void on_tick();
  // Throws PermissionDenied unless the caller may mutate; returns who the caller is
  // ("alice (uid 1000, pid 4242) over D-Bus"), for the log.
  std::string require_privileged(const char* method);

  Control& control_;
  int stop_fd_;
  gid_t admin_gid_ = static_cast<gid_t>(-1);
  std::unique_ptr<sdbus::IConnection> connection_;
  std::unique_ptr<sdbus::IObject> object_;
  std::thread thread_;
  std::set<uint64_t> flush_jobs_;  // jobs whose progress is still being signalled
  uint64_t next_pressure_usec_ = 0;
  bool below_low_water_ = false;
};

std::string DbusAdapterImpl::require_privileged(const char* method) {
  const sdbus::Message* m = object_->getCurrentlyProcessedMessage();
  uid_t euid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  std::vector<gid_t> groups;
  try {
    euid = m->getCredsEuid();
    gid = m->getCredsEgid();
  } catch (const sdbus::Error& e) {
    throw sdbus::Error(dbus_api::error_permission_denied,
                       std::string(method) + ": cannot read the caller's credentials");
  }
  if (admin_gid_ != static_cast<gid_t>(-1)) {
    try {
      groups = m->getCredsSupplementaryGids();
    } catch (const sdbus::Error&) {
      // Without supplementary groups only uid and primary group count.
    }
  }
  if (!caller_privileged(euid, gid, groups.data(), groups.size(), geteuid(), admin_gid_)) {
    log_notice("kvparkd: D-Bus %s refused to uid %u", method, static_cast<unsigned>(euid));
    throw sdbus::Error(dbus_api::error_permission_denied,
                       std::string(method) + " needs root or the admin group");
  }
  std::string who;
  if (const passwd* user = getpwuid(euid); user != nullptr) who = std::string(user->pw_name) + " ";
  who += "(uid " + std::to_string(euid);
  try {
    who += ", pid " + std::to_string(m->getCredsPid());
  } catch (const sdbus::Error&) {
    // The pid is for the log only.
  }
  return who + ") over D-Bus";
}

void DbusAdapterImpl::register_members() {
  const char* iface = dbus_api::interface_name;
  sdbus::IObject& o = *object_;
  o.registerMethod("Status").onInterface(iface).withOutputParamNames("status").implementedAs(
      [this] { return status_dict(control_.status()); });
  o.registerMethod("Stats").onInterface(iface).withOutputParamNames("stats").implementedAs(
      [this] { return stats_dict(control_.status()); });
  o.registerMethod("ListNamespaces")
      .onInterface(iface)
      .withOutputParamNames("namespaces")
      .implementedAs([this] {
        std::vector<Dict> out;
        for (const NamespaceSummary& n : control_.namespaces()) out.push_back(namespace_dict(n));
        return out;
      });
  o.registerMethod("ListEntries")
      .onInterface(iface)
      .withInputParamNames("filter")
      .withOutputParamNames("entries", "total")
      .implementedAs([this](const Dict& filter) {
        uint64_t total = 0;
        std::vector<Dict> out;
        for (const EntrySummary& e : control_.entries(parse_filter(filter), total)) {
          out.push_back(entry_dict(e));
        }
        return std::make_tuple(std::move(out), total);
      });
  o.registerMethod("ShowEntry")
      .onInterface(iface)
      .withInputParamNames("id")
      .withOutputParamNames("entry")
      .implementedAs([this](uint64_t id) {
        EntrySummary e;
        check(control_.entry(id, e), "entry " + std::to_string(id));
        return entry_dict(e);
      });
  for (const char* name : {"Pin", "Unpin"}) {
    const bool pinned = std::string(name) == "Pin";
    o.registerMethod(name).onInterface(iface).withInputParamNames("id").implementedAs(
        [this, name, pinned](uint64_t id) {
          require_privileged(name);
          check(control_.pin(id, pinned), "entry " + std::to_string(id));
        });
  }
  o.registerMethod("Evict").onInterface(iface).withInputParamNames("id").implementedAs(
      [this](uint64_t id) {
        require_privileged("Evict");
        std::string message;
        const Status s = control_.evict(id, message);
        check_explained(s, message, "evict entry " + std::to_string(id));
      });
  o.registerMethod("Flush").onInterface(iface).withOutputParamNames("job").implementedAs([this] {
    require_privileged("Flush");
    uint64_t job = 0;
    check(control_.start_flush(job), "flush");
    flush_jobs_.insert(job);
    return job;
  });
  o.registerMethod("GetFlushProgress")
      .onInterface(iface)
      .withInputParamNames("job")
      .withOutputParamNames("progress")
      .implementedAs([this](uint64_t job) {
        FlushProgress p;
        check(control_.flush_progress(job, p), "flush job " + std::to_string(job));
        return progress_dict(p);
      });
  o.registerMethod("DropNamespace")
      .onInterface(iface)
      .withInputParamNames("id")
      .withOutputParamNames("dropped")
      .implementedAs([this](const std::string& text) {
        require_privileged("DropNamespace");
        Hash128 id;
        if (!parse_hex128(text, id)) throw_status(Status::InvalidArgument, "namespace " + text);
        uint64_t dropped = 0;
        check(control_.drop_namespace(id, dropped), "namespace " + text);
        return dropped;
      });
  o.registerMethod("SetLimit")
      .onInterface(iface)
      .withInputParamNames("name", "value")
      .implementedAs([this](const std::string& name, uint64_t value) {
        const std::string caller = require_privileged("SetLimit");
        std::string message;
        const Status s = control_.set_limit(name, value, caller, message);
        check_explained(s, message, "limit " + name);
      });
  o.registerMethod("Reload").onInterface(iface).withOutputParamNames("message").implementedAs(
      [this] {
        require_privileged("Reload");
        std::string message;
        const Status s = control_.reload_config(message);
        if (s != Status::Ok) throw_status(s, message.empty() ? "reload" : message);
        return message;
      });

  o.registerSignal("FlushProgress")
      .onInterface(iface)
      .withParameters<uint64_t, bool, std::string, uint64_t, uint64_t, uint64_t, uint64_t>(
          "job", "done", "status", "entries_done", "entries_total", "bytes_done", "bytes_total");
  o.registerSignal("MemoryPressure")
      .onInterface(iface)
      .withParameters<uint64_t, uint64_t>("free_bytes", "low_water_bytes");

  for (const StatusField& f : status_fields()) {
    if (f.dbus_property == nullptr) continue;
    std::visit(
        [&](auto member) {
          o.registerProperty(f.dbus_property).onInterface(iface).withGetter(
              [this, member] { return control_.status().*member; });
        },
        f.member);
  }
  o.finishRegistration();
}

void DbusAdapterImpl::on_tick() {
  for (auto it = flush_jobs_.begin(); it != flush_jobs_.end();) {
    FlushProgress p;
    const Status s = control_.flush_progress(*it, p);
    if (s != Status::Ok) p = {.job_id = *it, .done = true, .status = s};
    object_->emitSignal("FlushProgress")
        .onInterface(dbus_api::interface_name)
        .withArguments(p.job_id, p.done, std::string(status_name(p.status)), p.entries_done,
                       p.entries_total, p.bytes_done, p.bytes_total);
    it = p.done ? flush_jobs_.erase(it) : std::next(it);
  }
  const uint64_t now = monotonic_usec();
  if (now < next_pressure_usec_) return;
  next_pressure_usec_ = now + dbus_api::pressure_poll_usec;
  const StatusInfo s = control_.status();
  const bool below = s.arena_data_bytes > 0 && s.arena_free_bytes < s.arena_low_water_bytes;
  if (below && !below_low_water_) {  // once per crossing, not once per second
    object_->emitSignal("MemoryPressure")
        .onInterface(dbus_api::interface_name)
        .withArguments(s.arena_free_bytes, s.arena_low_water_bytes);
  }
  below_low_water_ = below;
}

void DbusAdapterImpl::run() {
  uint64_t next_tick = monotonic_usec();
  try {
    for (;;) {
      while (connection_->processPendingRequest()) {
      }
      uint64_t now = monotonic_usec();
      if (now >= next_tick) {
        on_tick();
        next_tick = now + dbus_api::flush_poll_usec;
        continue;  // emitted signals may need writing
      }
      const sdbus::IConnection::PollData poll_data = connection_->getEventLoopPollData();
      uint64_t wake = std::min(next_tick, poll_data.timeout_usec);
      now = monotonic_usec();
      const int timeout_msec = wake <= now ? 0 : static_cast<int>((wake - now + 999) / 1000);
      pollfd fds[2] = {{poll_data.fd, poll_data.events, 0}, {stop_fd_, POLLIN, 0}};
      if (poll(fds, 2, timeout_msec) < 0 && errno != EINTR) {
        log_error("kvparkd: D-Bus adapter: poll failed: %s; D-Bus control stops", strerror(errno));
        return;
      }
      if (fds[1].revents != 0) return;
    }
  } catch (const sdbus::Error& e) {
    log_error("kvparkd: D-Bus connection lost (%s); D-Bus control stops, engines unaffected",
              e.getMessage().c_str());
  }
}

}  // namespace

bool caller_privileged(uid_t caller_euid, gid_t caller_gid, const gid_t* groups, size_t group_count,
                       uid_t daemon_uid, gid_t admin_gid) {
  if (caller_euid == static_cast<uid_t>(-1)) return false;
  if (caller_euid == 0 || caller_euid == daemon_uid) return true;
  if (admin_gid == static_cast<gid_t>(-1)) return false;
  if (caller_gid == admin_gid) return true;
  return std::find(groups, groups + group_count, admin_gid) != groups + group_count;
}

std::unique_ptr<DbusAdapter> DbusAdapter::start(const DbusAdapterOptions& options,
                                                Control& control, std::string& ret_error) {
  auto adapter = std::make_unique<DbusAdapterImpl>(options, control);
  try {
    adapter->connect(options.bus);
  } catch (const sdbus::Error& e) {
    ret_error = e.getName() + ": " + e.getMessage();
    return nullptr;
  }
  return adapter;
}

}  // namespace kvpark::daemon
