// The value model (DESIGN.md §5): what a parked entry is worth, as expected saved
// prefill seconds per arena byte. Pure functions of an entry, its namespace and the
// time: host eviction ranks its candidates with them (eviction_policy.h), the
// tiering policy decides with them what deserves a disk write (tiering_policy.h).
#pragma once

#include <cstdint>

#include "daemon/entry_table.h"

namespace kvpark::daemon {

// Prefill rate assumed for namespaces that did not declare one: 16,484 tokens in
// 2.36 s (DESIGN.md §1).
inline constexpr uint32_t prefill_tokens_per_second_default = 7000;
// Reuse likelihood halves every half-life since last use: a private continuation is
// likely to return within minutes or not at all; a shared head stays useful for hours.
inline constexpr uint64_t private_half_life_usec = 10ull * 60 * 1'000'000;
inline constexpr uint64_t shared_half_life_usec = 6ull * 3600 * 1'000'000;
// A private continuation younger than this is worth a disk write (a returning session).
inline constexpr uint64_t private_keep_usec = private_half_life_usec;
// What an entry with a disk copy is worth keeping on the host, relative to one without.
inline constexpr double disk_copy_value_share = 0.1;

// How much more a kind of evidence says "this will be asked for again".
double evidence_weight(Evidence evidence);
// Seconds of prefill the entry spares an engine of its namespace: a block its own
// tokens, a snapshot everything up to its position (for snapshot-required engines
// nothing restores without one).
double saved_prefill_seconds(const Entry& e, const NamespaceInfo& ns);
// Expected saved prefill seconds per arena byte at now_usec (CLOCK_MONOTONIC_COARSE):
// saved seconds × evidence weight (× 2 when shared) × reuse likelihood (1 + hits,
// halving every half-life since last use) × disk_copy_value_share when a disk copy
// exists, over the entry's extent bytes.
double value_density(const Entry& e, const NamespaceInfo& ns, uint64_t now_usec);
// Worth a disk write: shared, reused, marked by evidence other than default automatic,
// or a private continuation last used less than private_keep_usec ago.
bool worth_keeping(const Entry& e, uint64_t now_usec);

}  // namespace kvpark::daemon
