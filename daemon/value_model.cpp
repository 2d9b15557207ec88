// The value model (see value_model.h).
#include "daemon/value_model.h"

#include <algorithm>
#include <cmath>

namespace kvpark::daemon {

double evidence_weight(Evidence evidence) {
  switch (evidence) {
    case Evidence::ExplicitBreakpoint: return 4.0;
    case Evidence::ObservedRecurrence: return 3.0;  // counts as shared, seen twice
    case Evidence::RequestedAutomatic: return 2.0;
    case Evidence::EngineStructural: return 2.0;
    case Evidence::DefaultAutomatic: return 1.0;
  }
  return 1.0;
}

double saved_prefill_seconds(const Entry& e, const NamespaceInfo& ns) {
  const double rate = ns.prefill_tokens_per_second != 0 ? ns.prefill_tokens_per_second
                                                        : prefill_tokens_per_second_default;
  const double tokens = e.kind == EntryKind::Block ? ns.geometry.block_tokens : e.position;
  return tokens / rate;
}

double value_density(const Entry& e, const NamespaceInfo& ns, uint64_t now) {
  const bool shared = e.entry_class == EntryClass::Shared ||
                      e.evidence == Evidence::ObservedRecurrence;
  const double age = static_cast<double>(now - std::min(e.last_use_usec, now));
  const double half_life = shared ? shared_half_life_usec : private_half_life_usec;
  const double likelihood = (1.0 + static_cast<double>(e.hits)) * std::exp2(-age / half_life);
  const double weight = evidence_weight(e.evidence) * (shared ? 2.0 : 1.0);
  // Dropping the host copy of an entry that is safe on disk loses only a promotion.
  const double tier = e.on_disk ? disk_copy_value_share : 1.0;
  return saved_prefill_seconds(e, ns) * weight * likelihood * tier /
         static_cast<double>(e.extent_bytes);
}

bool worth_keeping(const Entry& e, uint64_t now) {
  // Spill what was reused, is shared, was asked for, or is a conversation's fresh
  // turn (its session is likely to return); not every old one-off.
  const uint64_t age = now - std::min(e.last_use_usec, now);
  return e.entry_class == EntryClass::Shared || e.hits > 0 ||
         e.evidence != Evidence::DefaultAutomatic || age < private_keep_usec;
}

}  // namespace kvpark::daemon
