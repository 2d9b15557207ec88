// The systemd notify protocol (sd_notify(3)) for kvparkd: READY, STATUS,
// STOPPING, and watchdog pings from the event loop.
//
// Every call is a no-op when $NOTIFY_SOCKET is unset, so the daemon runs the
// same outside systemd. READY=1 is sent once, after the engine socket listens
// (a connect() then succeeds). Watchdog pings go out from the loop's tick at half
// of $WATCHDOG_USEC, so a stalled loop stops them and systemd restarts the unit.
//
// Sends never block the loop on a manager that does not read: the socket is
// non-blocking, a periodic message (STATUS, WATCHDOG) that finds the manager's
// queue full is dropped, and a state change (READY, RELOADING, STOPPING) waits at
// most state_change_wait_msec for room. The log says once when the manager stops
// reading and once when it reads again. (sd_notify(3) blocks in that case: every
// engine would wait on a busy service manager.)
#pragma once

#include <cstdint>
#include <string>

namespace kvpark::daemon {

// How long the loop may sleep between ticks for the watchdog to stay fed.
// Zero watchdog: `idle_msec`.
int watchdog_tick_msec(uint64_t watchdog_usec, int idle_msec);

inline constexpr int state_change_wait_msec = 1000;

class Notifier {
 public:
  // watchdog_usec: from $WATCHDOG_USEC (0: no watchdog).
  explicit Notifier(uint64_t watchdog_usec);
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  void ready(const std::string& status);  // READY=1 and STATUS=
  void status(const std::string& status);
  void reloading();                          // RELOADING=1
  void reloaded(const std::string& status);  // READY=1 again after a reload
  void stopping(const std::string& status);
  // Loop thread, every tick: pings when half the interval has passed.
  void tick(uint64_t now_usec);

  uint64_t watchdog_usec() const { return watchdog_usec_; }
  uint64_t pings_sent() const { return pings_sent_; }
  uint64_t dropped() const { return dropped_; }  // messages the manager had no room for

 private:
  void send(const std::string& message, int wait_msec);
  bool connect_socket();  // to $NOTIFY_SOCKET; false when unset or unusable

  int fd_ = -1;
  bool manager_reading_ = true;
  uint64_t dropped_ = 0;
  uint64_t watchdog_usec_ = 0;
  uint64_t last_ping_usec_ = 0;
  uint64_t pings_sent_ = 0;
};

}  // namespace kvpark::daemon
