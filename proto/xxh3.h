// The one include of xxHash for checksums over payload-sized data.
//
// libxxhash's plain entry points are built for the x86-64 baseline (SSE2); its
// dispatching ones pick SSE2, AVX2 or AVX-512 once from cpuid and run about twice
// as fast on the machines kvpark runs on. A verified restore hashes every byte it
// copies, so the baseline build would cost close to a second copy. The values are
// the same either way: XXH3 is one algorithm, the dispatch picks only the code.
#pragma once

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>  // redefines XXH3_64bits, XXH3_64bits_update, XXH3_128bits...
#endif
