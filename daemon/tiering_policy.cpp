// Tiering decisions (see tiering_policy.h).
#include "daemon/tiering_policy.h"

#include <algorithm>

#include "daemon/clock.h"
#include "daemon/value_model.h"

namespace kvpark::daemon {

bool TieringPolicy::demotes(const Entry& e, bool disk_writable, uint64_t now) {
  return disk_writable && !e.on_disk && worth_keeping(e, now);
}

bool TieringPolicy::flush_takes(const Entry& e, bool everything, uint64_t now) {
  return everything || worth_keeping(e, now);
}

bool TieringPolicy::load_beats_recompute(const Entry& e, const NamespaceInfo& ns) const {
  if (disk_read_bytes_per_second_ <= 0) return true;  // not measured yet: try the disk
  return static_cast<double>(e.extent_bytes) / disk_read_bytes_per_second_ <
         saved_prefill_seconds(e, ns);
}

void TieringPolicy::promotion_started() {
  if (promotions_in_flight_++ == 0) {
    promotion_busy_since_usec_ = monotonic_usec();
    promotion_busy_bytes_ = 0;
  }
}

void TieringPolicy::promotion_completed(uint64_t extent_bytes) {
  if (--promotions_in_flight_ != 0 ||
      promotion_busy_bytes_ + extent_bytes < bandwidth_sample_bytes_min) {
    return;
  }
  // A busy period ended: its bytes over its duration is what the device delivered.
  const uint64_t bytes = promotion_busy_bytes_ + extent_bytes;
  const uint64_t took = std::max<uint64_t>(monotonic_usec() - promotion_busy_since_usec_, 1);
  const double sample = static_cast<double>(bytes) * 1e6 / static_cast<double>(took);
  disk_read_bytes_per_second_ = disk_read_bytes_per_second_ <= 0
                                    ? sample
                                    : 0.7 * disk_read_bytes_per_second_ + 0.3 * sample;
}

}  // namespace kvpark::daemon
