// The D-Bus contract of org.kvpark.Park1, shared by kvparkd's adapter and kvparkctl.
//
// Header-only names and limits, no sdbus types: the wire shapes are listed here
// once so the two ends cannot drift apart. Records travel as a{sv} dictionaries
// (keys below) so a client can add fields without breaking older readers; ids of
// namespaces and entry keys travel as 32 hex digits (high word first).
//
//   Status()                     -> a{sv}          everything StatusInfo holds
//   Stats()                      -> a{st}          every numeric figure
//   ListNamespaces()             -> aa{sv}
//   ListEntries(a{sv} filter)    -> aa{sv}, t total   filter keys: namespace s,
//                                    tier s (host|disk), class s (shared|private),
//                                    offset t, limit t (<= entries_page_max)
//   ShowEntry(t id)              -> a{sv}
//   Pin(t id), Unpin(t id), Evict(t id)                 [privileged]
//   Flush()                      -> t job             [privileged]
//   GetFlushProgress(t job)      -> a{sv}
//   DropNamespace(s id)          -> t dropped entries  [privileged]
//   SetLimit(s name, t value)                          [privileged]
//                                    InvalidArgument for an unknown name or a value
//                                    out of range, BadState for a disk limit without
//                                    a disk tier (daemon/runtime_limits.h)
//   Reload()                     -> s message          [privileged]
//   signal FlushProgress(t job, b done, s status, t entries_done, t entries_total,
//                        t bytes_done, t bytes_total)
//   signal MemoryPressure(t free_bytes, t low_water_bytes)
//   properties (read-only): Version s, ArenaBytes t, ArenaFreeBytes t,
//     ArenaLowWaterBytes t, Entries t, Pinned t, Connections t, Leases t, Namespaces t
#pragma once

#include <cstdint>

namespace kvpark::dbus_api {

inline constexpr const char* bus_name = "org.kvpark.Park1";
inline constexpr const char* interface_name = "org.kvpark.Park1";
inline constexpr const char* object_path = "/org/kvpark/Park1";

// Error names: one per operational outcome an operator acts on differently.
// Clients act on the name; the message is for people and names the cause (for a
// value out of range, the allowed range with the figures: "arena-low-water 2G is
// larger than the arena (512M): allowed 0 to 512M"; for Evict, "entry N is
// pinned"). Messages may change between releases, names do not.
inline constexpr const char* error_not_found = "org.kvpark.Park1.Error.NotFound";
inline constexpr const char* error_permission_denied = "org.kvpark.Park1.Error.PermissionDenied";
inline constexpr const char* error_bad_state = "org.kvpark.Park1.Error.BadState";
inline constexpr const char* error_invalid_argument = "org.kvpark.Park1.Error.InvalidArgument";
inline constexpr const char* error_unavailable = "org.kvpark.Park1.Error.Unavailable";
inline constexpr const char* error_failed = "org.kvpark.Park1.Error.Failed";  // I/O, corruption

// One ListEntries page; a bigger limit is refused with InvalidArgument so a
// caller cannot make one reply outgrow the bus's message size cap.
inline constexpr uint64_t entries_page_max = 1000;
inline constexpr uint64_t entries_page_default = 100;
// How often the adapter samples free bytes for MemoryPressure and polls running
// flush jobs for FlushProgress.
inline constexpr uint64_t pressure_poll_usec = 1'000'000;
inline constexpr uint64_t flush_poll_usec = 200'000;

}  // namespace kvpark::dbus_api
