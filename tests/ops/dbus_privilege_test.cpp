// The D-Bus adapter's privilege rule (caller_privileged, daemon/dbus_adapter.h):
// root, the daemon's own uid, or a member of the admin group; nobody else.
#include <gtest/gtest.h>

#include "daemon/dbus_adapter.h"

using kvpark::daemon::caller_privileged;

namespace {

constexpr uid_t daemon_uid = 990;
constexpr gid_t admin_gid = 991;
constexpr gid_t no_group = static_cast<gid_t>(-1);

TEST(DbusPrivilege, RootAndTheDaemonsOwnUidAreAllowed) {
  EXPECT_TRUE(caller_privileged(0, 0, nullptr, 0, daemon_uid, no_group));
  EXPECT_TRUE(caller_privileged(daemon_uid, 100, nullptr, 0, daemon_uid, no_group));
}

TEST(DbusPrivilege, OtherUsersAreRefused) {
  const gid_t groups[] = {100, 27};
  EXPECT_FALSE(caller_privileged(1000, 1000, groups, 2, daemon_uid, admin_gid));
}

TEST(DbusPrivilege, AdminGroupMembersAreAllowedByPrimaryOrSupplementaryGroup) {
  const gid_t groups[] = {100, admin_gid};
  EXPECT_TRUE(caller_privileged(1000, admin_gid, nullptr, 0, daemon_uid, admin_gid));
  EXPECT_TRUE(caller_privileged(1000, 1000, groups, 2, daemon_uid, admin_gid));
}

TEST(DbusPrivilege, MissingAdminGroupAllowsOnlyRootAndOwnUid) {
  const gid_t groups[] = {no_group};  // a group list holding -1 must not match "no group"
  EXPECT_FALSE(caller_privileged(1000, no_group, groups, 1, daemon_uid, no_group));
}

TEST(DbusPrivilege, UnknownCallerIsRefused) {
  EXPECT_FALSE(caller_privileged(static_cast<uid_t>(-1), 0, nullptr, 0, daemon_uid, admin_gid));
}

}  // namespace
