// sd_notify wrapper (see notify.h).
#include "daemon/notify.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstring>

#include "daemon/log.h"

namespace kvpark::daemon {

int watchdog_tick_msec(uint64_t watchdog_usec, int idle_msec) {
  if (watchdog_usec == 0) return idle_msec;
  // A quarter of the interval: a ping is due every half, and a tick may come late.
  const uint64_t quarter_msec = watchdog_usec / 4 / 1000;
  return static_cast<int>(std::clamp<uint64_t>(quarter_msec, 1, static_cast<uint64_t>(idle_msec)));
}

Notifier::Notifier(uint64_t watchdog_usec) : watchdog_usec_(watchdog_usec) {}

void Notifier::send(const std::string& message) {
  // sd_notify returns 0 without $NOTIFY_SOCKET, negative errno on failure.
  if (const int r = sd_notify(0, message.c_str()); r < 0) {
    log_warning_limited("kvparkd: sd_notify failed: %s", strerror(-r));
  }
}

void Notifier::ready(const std::string& status) {
  send("READY=1\nSTATUS=" + status);
}

void Notifier::status(const std::string& status) {
  send("STATUS=" + status);
}

void Notifier::reloading() {
  send("RELOADING=1\nSTATUS=reloading configuration");
}

void Notifier::reloaded(const std::string& status) {
  send("READY=1\nSTATUS=" + status);
}

void Notifier::stopping(const std::string& status) {
  send("STOPPING=1\nSTATUS=" + status);
}

void Notifier::tick(uint64_t now_usec) {
  if (watchdog_usec_ == 0 || now_usec - last_ping_usec_ < watchdog_usec_ / 2) return;
  last_ping_usec_ = now_usec;
  ++pings_sent_;
  send("WATCHDOG=1");
}

}  // namespace kvpark::daemon
