// kvparkd.conf: every error names its line, flags override the file, and
// --print-config's output reads back to the same values.
#include "daemon/command_line.h"
#include "daemon/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "proto/limits.h"

namespace kvpark::daemon {
namespace {

DaemonOptions apply_ok(const std::string& text) {
  DaemonOptions o = default_options();
  std::string error;
  EXPECT_TRUE(apply_config_text(text, "kvparkd.conf", o, error)) << error;
  EXPECT_TRUE(finish_options(o, error)) << error;
  return o;
}

std::string apply_error(const std::string& text) {
  DaemonOptions o = default_options();
  std::string error;
  EXPECT_FALSE(apply_config_text(text, "kvparkd.conf", o, error)) << text;
  return error;
}

// A temporary file removed at scope end.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& text) {
    char templ[] = "/tmp/kvparkd-conf-XXXXXX";
    const int fd = mkstemp(templ);
    path = templ;
    const ssize_t n = write(fd, text.data(), text.size());
    (void)n;
    close(fd);
  }
  ~TempFile() { unlink(path.c_str()); }
};

bool parse(std::vector<std::string> args, DaemonOptions& ret, int& ret_exit,
           std::string* ret_stdout = nullptr, std::string* ret_stderr = nullptr) {
  args.insert(args.begin(), "kvparkd");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  const bool ok = parse_options(static_cast<int>(args.size()), argv.data(), ret, ret_exit);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (ret_stdout != nullptr) *ret_stdout = out;
  if (ret_stderr != nullptr) *ret_stderr = err;
  return ok;
}

TEST(ConfigFile, ParsesEveryKeyWithCommentsAndBlankLines) {
  const DaemonOptions o = apply_ok(
      "# comment\n"
      "; another comment\n"
      "\n"
      "socket = /run/x/kvparkd.sock\n"
      "arena_size=2G\n"
      "  arena_name   =   /kvpark-x  \n"
      "reservation_max = 256M\n"
      "arena_low_water = 64M\n"
      "attach_group = render\n"
      "admin_group = wheel\n"
      "http_listen = [::1]:9100\n"
      "http_allow_remote = yes\n"
      "dbus = off\n"
      "disk_dir = /var/lib/kvpark\n"
      "disk_capacity = 1T\n"
      "disk_write_budget_per_day = 50G\n"
      "spill_on_shutdown = false\n");
  EXPECT_EQ(o.socket_path, "/run/x/kvparkd.sock");
  EXPECT_EQ(o.arena_bytes, 2ull << 30);
  EXPECT_EQ(o.arena_name, "/kvpark-x");
  EXPECT_EQ(o.reservation_bytes_max, 256ull << 20);
  EXPECT_EQ(o.arena_low_water_bytes, 64ull << 20);
  EXPECT_EQ(o.attach_group, "render");
  EXPECT_EQ(o.admin_group, "wheel");
  EXPECT_EQ(o.http_listen, "[::1]:9100");
  EXPECT_TRUE(o.http_allow_remote);
  EXPECT_EQ(o.dbus_bus, DbusBus::Off);
  EXPECT_EQ(o.disk_directory, "/var/lib/kvpark");
  EXPECT_EQ(o.disk_capacity_bytes, 1ull << 40);
  EXPECT_EQ(o.disk_write_budget_bytes_per_day, 50ull << 30);
  EXPECT_FALSE(o.spill_on_shutdown);
}

TEST(ConfigFile, UnknownKeyNamesFileLineAndSuggestion) {
  const std::string error = apply_error("arena_size = 1G\n\n# x\narena_sise = 2G\n");
  EXPECT_EQ(error, "kvparkd.conf:4: unknown key 'arena_sise' (did you mean 'arena_size'?)");
}

TEST(ConfigFile, BadValuesNameTheirLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"# c\narena_size = lots\n", "kvparkd.conf:2: bad value for 'arena_size'"},
      {"arena_size = 1M\n", "kvparkd.conf:1: bad value for 'arena_size'"},  // below the minimum
      {"\n\nhttp_allow_remote = maybe\n", "kvparkd.conf:3: bad value for 'http_allow_remote'"},
      {"spill_on_shutdown = 2\n", "kvparkd.conf:1: bad value for 'spill_on_shutdown'"},
      {"dbus = both\n", "kvparkd.conf:1: bad value for 'dbus'"},
      {"http_listen = localhost\n", "kvparkd.conf:1: bad value for 'http_listen'"},
      {"http_listen = 127.0.0.1:70000\n", "kvparkd.conf:1: bad value for 'http_listen'"},
      {"socket = relative.sock\n", "kvparkd.conf:1: bad value for 'socket'"},
      {"disk_dir = var/lib\n", "kvparkd.conf:1: bad value for 'disk_dir'"},
      {"arena_name = no-slash\n", "kvparkd.conf:1: bad value for 'arena_name'"},
      {"reservation_max = 0\n", "kvparkd.conf:1: bad value for 'reservation_max'"},
      {"attach_group =\n", "kvparkd.conf:1: empty value for 'attach_group'"},
      {"just words\n", "kvparkd.conf:1: expected 'key = value'"},
      {"[kvparkd]\n", "kvparkd.conf:1: sections are not used"},
      {"remote = redis://host:0\n", "kvparkd.conf:1: bad value for 'remote'"},
      {"remote = redis://\n", "kvparkd.conf:1: bad value for 'remote'"},
      {"remote_write = some\n", "kvparkd.conf:1: bad value for 'remote_write'"},
      {"remote_password_file = secret.txt\n", "kvparkd.conf:1: bad value for 'remote_password_file'"},
  };
  for (const auto& [text, prefix] : cases) {
    const std::string error = apply_error(text);
    EXPECT_EQ(error.rfind(prefix, 0), 0u) << "got: " << error;
  }
}

TEST(ConfigFile, DuplicateKeyNamesBothLines) {
  EXPECT_EQ(apply_error("arena_size = 1G\ndbus = off\narena_size = 2G\n"),
            "kvparkd.conf:3: duplicate key 'arena_size' (first set on line 1)");
}

TEST(ConfigFile, RemoteHttpNeedsExplicitPermission) {
  DaemonOptions o = default_options();
  std::string error;
  ASSERT_TRUE(apply_config_text("http_listen = 0.0.0.0:7797\n", "f", o, error));
  EXPECT_FALSE(finish_options(o, error));
  EXPECT_NE(error.find("http_allow_remote"), std::string::npos) << error;
  ASSERT_TRUE(set_config_value(o, "http_allow_remote", "true", error));
  EXPECT_TRUE(finish_options(o, error)) << error;
}

TEST(ConfigFile, LowWaterAboveArenaIsRefused) {
  DaemonOptions o = default_options();
  std::string error;
  ASSERT_TRUE(apply_config_text("arena_size = 64M\narena_low_water = 65M\n", "f", o, error));
  EXPECT_FALSE(finish_options(o, error));
  EXPECT_NE(error.find("arena_low_water"), std::string::npos);
}

TEST(ConfigFile, HttpOffAndDiskOffMeanEmpty) {
  const DaemonOptions o = apply_ok("http_listen = off\ndisk_dir = off\n");
  EXPECT_TRUE(o.http_listen.empty());
  EXPECT_TRUE(o.disk_directory.empty());
}

TEST(ConfigFile, RemoteTierKeysParseAndPrintBack) {
  const DaemonOptions o = apply_ok(
      "remote = redis://10.0.0.1:7000,10.0.0.2:7001\nremote_user = kvpark\n"
      "remote_password_file = /etc/kvpark/redis-password\nremote_write = all\n");
  EXPECT_EQ(o.remote, "redis://10.0.0.1:7000,10.0.0.2:7001");
  EXPECT_EQ(o.remote_user, "kvpark");
  EXPECT_EQ(o.remote_password_file, "/etc/kvpark/redis-password");
  EXPECT_EQ(o.remote_write, "all");
  const std::string printed = format_config(o);
  EXPECT_NE(printed.find("remote = redis://10.0.0.1:7000,10.0.0.2:7001\n"), std::string::npos);
  EXPECT_NE(printed.find("remote_write = all\n"), std::string::npos);
  const DaemonOptions off = apply_ok("remote = off\n");
  EXPECT_TRUE(off.remote.empty());
  EXPECT_EQ(off.remote_write, "shared");  // the default
}

TEST(ConfigFile, MissingDefaultFileIsFineMissingExplicitFileIsNot) {
  DaemonOptions o = default_options();
  std::string error;
  EXPECT_TRUE(apply_config_file("/nonexistent/kvparkd.conf", false, o, error));
  EXPECT_FALSE(o.config_file_read);
  EXPECT_FALSE(apply_config_file("/nonexistent/kvparkd.conf", true, o, error));
  EXPECT_NE(error.find("/nonexistent/kvparkd.conf"), std::string::npos);
}

TEST(ConfigCommandLine, FlagsOverrideTheFile) {
  TempFile file("arena_size = 128M\narena_low_water = 8M\nhttp_listen = 127.0.0.1:9000\n");
  DaemonOptions o;
  int exit_code = -1;
  ASSERT_TRUE(parse({"--config", file.path, "--arena-low-water", "16M", "--http-listen", "off",
                     "--spill-on-shutdown=false", "--http-allow-remote"},
                    o, exit_code));
  EXPECT_EQ(o.arena_bytes, 128ull << 20);           // from the file
  EXPECT_EQ(o.arena_low_water_bytes, 16ull << 20);  // flag wins
  EXPECT_TRUE(o.http_listen.empty());
  EXPECT_FALSE(o.spill_on_shutdown);
  EXPECT_TRUE(o.http_allow_remote);
  EXPECT_TRUE(o.config_file_read);
}

TEST(ConfigCommandLine, FileErrorExitsTwoNamingTheLine) {
  TempFile file("arena_size = 128M\n\narena_sise = 1G\n");
  DaemonOptions o;
  int exit_code = -1;
  std::string err;
  EXPECT_FALSE(parse({"--config", file.path}, o, exit_code, nullptr, &err));
  EXPECT_EQ(exit_code, 2);
  EXPECT_NE(err.find(file.path + ":3: unknown key 'arena_sise'"), std::string::npos) << err;
}

TEST(ConfigCommandLine, MissingExplicitFileExitsTwo) {
  DaemonOptions o;
  int exit_code = -1;
  std::string err;
  EXPECT_FALSE(parse({"--config", "/nonexistent/kvparkd.conf"}, o, exit_code, nullptr, &err));
  EXPECT_EQ(exit_code, 2);
  EXPECT_NE(err.find("/nonexistent/kvparkd.conf"), std::string::npos);
}

TEST(ConfigCommandLine, BadFlagValueNamesTheFlag) {
  DaemonOptions o;
  int exit_code = -1;
  std::string err;
  EXPECT_FALSE(parse({"--dbus", "maybe"}, o, exit_code, nullptr, &err));
  EXPECT_EQ(exit_code, 2);
  EXPECT_NE(err.find("--dbus: bad value for 'dbus'"), std::string::npos) << err;
}

TEST(PrintConfig, RoundTripsThroughTheFileFormat) {
  TempFile file("arena_size = 96M\nreservation_max = 5000\ndisk_dir = /srv/kv\ndbus = off\n");
  DaemonOptions first;
  int exit_code = -1;
  std::string printed;
  EXPECT_FALSE(parse({"--config", file.path, "--arena-low-water", "3M", "--print-config"}, first,
                     exit_code, &printed));
  EXPECT_EQ(exit_code, 0);
  EXPECT_NE(printed.find("arena_size = 96M\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("reservation_max = 5000\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("arena_low_water = 3M\n"), std::string::npos) << printed;

  TempFile again(printed);
  DaemonOptions second;
  std::string reprinted;
  EXPECT_FALSE(parse({"--config", again.path, "--print-config"}, second, exit_code, &reprinted));
  EXPECT_EQ(exit_code, 0);
  // Identical but for the comment naming the file.
  const auto body = [](const std::string& s) { return s.substr(s.find("\nsocket = ")); };
  EXPECT_EQ(body(reprinted), body(printed));
}

TEST(PrintConfig, DefaultsRoundTrip) {
  DaemonOptions o = default_options();
  std::string error;
  ASSERT_TRUE(finish_options(o, error));
  DaemonOptions back = default_options();
  ASSERT_TRUE(apply_config_text(format_config(o), "printed", back, error)) << error;
  ASSERT_TRUE(finish_options(back, error));
  EXPECT_EQ(format_config(back), format_config(o));
}

TEST(ListenAddress, AcceptsNumericAddressesOnly) {
  std::string host;
  uint16_t port = 1;
  EXPECT_TRUE(parse_listen_address("127.0.0.1:0", host, port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 0);
  EXPECT_TRUE(parse_listen_address("[::1]:7797", host, port));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 7797);
  for (const char* bad : {"localhost:80", "127.0.0.1", "127.0.0.1:", ":80", "[::1]80", "::1:80",
                          "127.0.0.1:65536", "127.0.0.1:-1", "1.2.3:80"}) {
    EXPECT_FALSE(parse_listen_address(bad, host, port)) << bad;
  }
}

// A state directory removed at scope end, with runtime-overrides.conf holding `text`.
struct StateDirectory {
  std::string path;
  explicit StateDirectory(const std::string& text) {
    char templ[] = "/tmp/kvparkd-state-XXXXXX";
    path = mkdtemp(templ);
    if (!text.empty()) std::ofstream(path + "/" + runtime_overrides_file_name) << text;
  }
  ~StateDirectory() {
    unlink((path + "/" + runtime_overrides_file_name).c_str());
    rmdir(path.c_str());
  }
};

TEST(RuntimeOverrides, ApplyAfterTheFileAndTheFlags) {
  StateDirectory state("# written by kvparkd\narena_low_water = 8M\n");
  TempFile file("arena_low_water = 2M\n");
  DaemonOptions o;
  int exit_code = -1;
  std::string err;
  ASSERT_TRUE(parse({"--config", file.path, "--arena-low-water", "4M", "--state-dir", state.path},
                    o, exit_code, nullptr, &err)) << err;
  EXPECT_EQ(o.arena_low_water_bytes, 8ull << 20);
  ASSERT_EQ(o.override_values.size(), 1u);
  EXPECT_EQ(o.override_values[0].first, "arena_low_water");
  EXPECT_TRUE(o.overrides_warning.empty()) << o.overrides_warning;
  EXPECT_NE(format_config(o).find("# then the runtime overrides in " + state.path), std::string::npos);
}

TEST(RuntimeOverrides, AnotherKeyOrAValueThatNoLongerFitsIsIgnoredWithAWarning) {
  for (const char* text : {"arena_size = 2G\n", "arena_low_water = 2G\n", "arena_low_water\n"}) {
    SCOPED_TRACE(text);
    StateDirectory state(text);
    DaemonOptions o;
    int exit_code = -1;
    ASSERT_TRUE(parse({"--config", "/dev/null", "--arena-size", "1G", "--state-dir", state.path},
                      o, exit_code));
    EXPECT_EQ(o.arena_bytes, 1ull << 30);
    EXPECT_EQ(o.arena_low_water_bytes, 0u);
    EXPECT_TRUE(o.override_values.empty());
    EXPECT_NE(o.overrides_warning.find(runtime_overrides_file_name), std::string::npos)
        << o.overrides_warning;
    EXPECT_NE(o.overrides_warning.find("not applied"), std::string::npos) << o.overrides_warning;
  }
}

TEST(RuntimeOverrides, WrittenFileReadsBackAndLeavesNoTemporary) {
  StateDirectory state("");
  const std::string path = state.path + "/" + runtime_overrides_file_name;
  ASSERT_TRUE(write_runtime_overrides(path, {{"reservation_max", "64M"},
                                             {"arena_low_water", "16M"}}));
  EXPECT_NE(access(path.c_str(), R_OK), -1);
  EXPECT_EQ(access((path + ".tmp").c_str(), F_OK), -1);
  DaemonOptions o;
  int exit_code = -1;
  ASSERT_TRUE(parse({"--config", "/dev/null", "--state-dir", state.path}, o, exit_code));
  EXPECT_EQ(o.reservation_bytes_max, 64ull << 20);
  EXPECT_EQ(o.arena_low_water_bytes, 16ull << 20);
}

TEST(RuntimeOverrides, EverySetLimitNameHasAKey) {
  EXPECT_STREQ(limit_config_key(limit_arena_low_water), "arena_low_water");
  EXPECT_STREQ(limit_config_key(limit_reservation_max), "reservation_max");
  EXPECT_STREQ(limit_config_key(limit_disk_capacity), "disk_capacity");
  EXPECT_STREQ(limit_config_key(limit_disk_write_budget), "disk_write_budget_per_day");
  EXPECT_EQ(limit_config_key("arena-size"), nullptr);
}

TEST(DerivedDefaults, LowWaterIsAnEighthOfTheArenaWithADiskTierUnlessGiven) {
  EXPECT_EQ(apply_ok("arena_size = 512M\n").arena_low_water_bytes, 0u);
  EXPECT_EQ(apply_ok("arena_size = 512M\ndisk_dir = /var/lib/kvpark\n").arena_low_water_bytes,
            64ull << 20);
  EXPECT_EQ(apply_ok("arena_size = 512M\ndisk_dir = /var/lib/kvpark\narena_low_water = 0\n")
                .arena_low_water_bytes,
            0u) << "an explicit 0 is kept";
}

}  // namespace
}  // namespace kvpark::daemon
