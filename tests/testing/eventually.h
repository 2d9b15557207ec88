// wait_until (tests/testing/wait.h) as a gtest assertion that says what never held:
//
//   ASSERT_TRUE(eventually("every evicted record is unlinked", [&] { return ...; }));
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tests/testing/wait.h"

namespace kvpark::testing {

inline ::testing::AssertionResult eventually(const std::string& what,
                                             const std::function<bool()>& holds,
                                             int timeout_msec = wait_timeout_msec_default) {
  const uint64_t start = monotonic_msec();
  if (wait_until(holds, timeout_msec)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "still not true after " << (monotonic_msec() - start)
                                       << " ms (deadline " << timeout_msec << " ms): " << what;
}

}  // namespace kvpark::testing
