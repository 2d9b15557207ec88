// take_connection_id: ids wrap after 2^32 connections; a wrapped id never names a
// connection still open, 0, or the remote tier's pseudo-connection.
#include <gtest/gtest.h>

#include <set>

#include "daemon/remote_tier.h"
#include "daemon/server.h"

namespace kvpark::daemon {
namespace {

TEST(ConnectionIds, CountUpFromOne) {
  ConnectionId next = 1;
  const auto none_open = [](ConnectionId) { return false; };
  EXPECT_EQ(take_connection_id(next, none_open), 1u);
  EXPECT_EQ(take_connection_id(next, none_open), 2u);
  EXPECT_EQ(next, 3u);
}

TEST(ConnectionIds, WrapPastThePseudoConnectionAndZeroToAnIdNotOpen) {
  ConnectionId next = remote_connection_id - 1;  // UINT32_MAX - 1
  const std::set<ConnectionId> open = {1, 2, 4, remote_connection_id - 1};
  const auto is_open = [&open](ConnectionId id) { return open.contains(id); };
  // remote_connection_id - 1 is open, then the pseudo-connection, 0, 1 and 2: 3.
  EXPECT_EQ(take_connection_id(next, is_open), 3u);
  EXPECT_EQ(take_connection_id(next, is_open), 5u) << "4 is still open";
  EXPECT_EQ(take_connection_id(next, is_open), 6u);
}

}  // namespace
}  // namespace kvpark::daemon
