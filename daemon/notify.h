// The systemd notify protocol (sd_notify(3)) for kvparkd: READY, STATUS,
// STOPPING, and watchdog pings from the event loop.
//
// Every call is a no-op when $NOTIFY_SOCKET is unset, so the daemon runs the
// same outside systemd. READY=1 is sent once, after the engine socket listens
// (a connect() then succeeds). Watchdog pings go out from the loop's tick at half
// of $WATCHDOG_USEC, so a stalled loop stops them and systemd restarts the unit.
#pragma once

#include <cstdint>
#include <string>

namespace kvpark::daemon {

// How long the loop may sleep between ticks for the watchdog to stay fed.
// Zero watchdog: `idle_msec`.
int watchdog_tick_msec(uint64_t watchdog_usec, int idle_msec);

class Notifier {
 public:
  // watchdog_usec: from $WATCHDOG_USEC (0: no watchdog).
  explicit Notifier(uint64_t watchdog_usec);

  void ready(const std::string& status);  // READY=1 and STATUS=
  void status(const std::string& status);
  void reloading();                          // RELOADING=1
  void reloaded(const std::string& status);  // READY=1 again after a reload
  void stopping(const std::string& status);
  // Loop thread, every tick: pings when half the interval has passed.
  void tick(uint64_t now_usec);

  uint64_t watchdog_usec() const { return watchdog_usec_; }
  uint64_t pings_sent() const { return pings_sent_; }

 private:
  void send(const std::string& message);

  uint64_t watchdog_usec_ = 0;
  uint64_t last_ping_usec_ = 0;
  uint64_t pings_sent_ = 0;
};

}  // namespace kvpark::daemon
