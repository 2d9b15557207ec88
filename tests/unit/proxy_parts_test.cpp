// kvpark-proxy's pieces that need no upstream: options, the slot pool, the head
// single flight, the event splitter and the process witness (the parked slot-file
// format: tests/unit/sealed_payload_test.cpp).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "proto/limits.h"
#include "proxy/options.h"
#include "proxy/process_watch.h"
#include "proxy/prompt_prefixes.h"
#include "proxy/relay.h"
#include "proxy/route.h"
#include "proxy/slot_pool.h"
#include "tests/testing/eventually.h"
#include "tests/testing/loopback_tcp.h"
#include "tests/testing/thread_state.h"

namespace kvpark::proxy {
namespace {

bool parse(std::vector<std::string> args, ProxyOptions& o, std::string& error) {
  std::vector<char*> argv{const_cast<char*>("kvpark-proxy")};
  for (auto& a : args) argv.push_back(a.data());
  bool exit_now = false;
  return parse_command_line(int(argv.size()), argv.data(), o, exit_now, error);
}

TEST(ProxyOptions, FlagsSetUpstreamsStateAndListen) {
  ProxyOptions o = default_options();
  std::string error;
  ASSERT_TRUE(parse({"--listen", "0.0.0.0:9000", "--upstream", "a=http://127.0.0.1:8081/",
                     "--upstream", "b=http://127.0.0.1:8082", "--state", "b=-ctk q8_0",
                     "--slot-dir", "/run/x/", "--no-system-candidate", "--keep-billing-header"},
                    o, error))
      << error;
  EXPECT_EQ(o.listen_host, "0.0.0.0");
  EXPECT_EQ(o.listen_port, 9000);
  ASSERT_EQ(o.upstreams.size(), 2u);
  EXPECT_EQ(o.upstreams[0].url, "http://127.0.0.1:8081");  // trailing slash dropped
  EXPECT_EQ(o.upstreams[1].settings, "-ctk q8_0");
  EXPECT_EQ(o.slot_dir, "/run/x");
  EXPECT_FALSE(o.system_candidate);
  EXPECT_FALSE(o.normalize_billing_header);
  EXPECT_TRUE(default_options().normalize_billing_header);
}

TEST(ProxyOptions, BadValuesAreRefusedWithTheirFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "no upstream"},
      {{"--upstream", "a=https://x:1"}, "--upstream: upstream 'a': URL must start with http://"},
      {{"--upstream", "=http://x:1"}, "--upstream: expected NAME=VALUE"},
      {{"--upstream", "a=http://x:1", "--upstream", "b=http://x:1"}, "upstream http://x:1 given twice"},
      {{"--upstream", "a=http://x:1", "--state", "b=-fa on"}, "unknown upstream 'b'"},
      {{"--upstream", "a=http://x:1", "--listen", "nohost"}, "--listen: expected HOST:PORT"},
      {{"--upstream", "a=http://x:1", "--listen", "h:70000"}, "--listen: bad port"},
      {{"--upstream", "a=http://x:1", "--slot-dir", "/a", "--slot-dir", "/b"}, "given twice"},
      {{"--upstream", "a=http://x:1", "--bogus", "1"}, "unknown option --bogus"},
      {{"--upstream", "a=http://x:1", "--bogus"}, "unknown option --bogus"},  // not "needs a value"
      {{"--upstream", "a=http://x:1", "--socket"}, "--socket: needs a value"},
  };
  for (const auto& [args, expected] : cases) {
    ProxyOptions o = default_options();
    std::string error;
    EXPECT_FALSE(parse(args, o, error)) << expected;
    EXPECT_NE(error.find(expected), std::string::npos) << "got: " << error;
  }
}

TEST(ProxyOptions, OneNameOnSeveralUpstreamsSharesItsStateSettings) {
  ProxyOptions o = default_options();
  std::string error;
  ASSERT_TRUE(parse({"--upstream", "m=http://h:1", "--upstream", "m=http://h:2", "--state",
                     "m=-fa on", "--upstream", "m=http://h:3"},
                    o, error))
      << error;
  ASSERT_EQ(o.upstreams.size(), 3u);
  for (const auto& u : o.upstreams) EXPECT_EQ(u.settings, "-fa on") << u.url;
}

TEST(ProxyOptions, FileErrorsNameTheLineAndRepeatableKeysRepeat) {
  ProxyOptions o = default_options();
  std::string error;
  ASSERT_TRUE(apply_config_text("# comment\n; another\n\nupstream = a=http://h:1\n"
                                "upstream = b=http://h:2\nstate = a=-fa on\nsystem_candidate = no\n"
                                "normalize_billing_header = false\n",
                                "p.conf", o, error))
      << error;
  EXPECT_EQ(o.upstreams.size(), 2u);
  EXPECT_EQ(o.upstreams[0].settings, "-fa on");
  EXPECT_FALSE(o.system_candidate);
  EXPECT_FALSE(o.normalize_billing_header);

  ProxyOptions twice = default_options();
  EXPECT_FALSE(apply_config_text("listen = 127.0.0.1:1\nlisten = 127.0.0.1:2\n", "p.conf", twice,
                                 error));
  EXPECT_EQ(error, "p.conf:2: 'listen' given twice");
  ProxyOptions no_equals = default_options();
  EXPECT_FALSE(apply_config_text("upstream\n", "p.conf", no_equals, error));
  EXPECT_EQ(error, "p.conf:1: expected key = value");
  ProxyOptions bad_bool = default_options();
  EXPECT_FALSE(apply_config_text("system_candidate = maybe\n", "p.conf", bad_bool, error));
  EXPECT_EQ(error, "p.conf:1: expected true or false, got 'maybe'");
}

TEST(ProxyOptions, ConfigFileIsReadFirstAndFlagsOverrideIt) {
  char path[] = "/tmp/kvpark-proxy-conf-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text =
      "listen = 127.0.0.1:7000\nupstream = m=http://127.0.0.1:8081\nslot_dir = /run/p\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), ssize_t(text.size()));
  close(fd);
  ProxyOptions o = default_options();
  std::string error;
  // --config after the flag: the file is still applied first.
  ASSERT_TRUE(parse({"--listen", "127.0.0.1:7001", "--config", path}, o, error)) << error;
  EXPECT_EQ(o.listen_port, 7001);
  EXPECT_EQ(o.slot_dir, "/run/p");
  ASSERT_EQ(o.upstreams.size(), 1u);
  EXPECT_EQ(o.config_path, path);
  unlink(path);

  ProxyOptions missing = default_options();
  EXPECT_FALSE(parse({"--config", path}, missing, error));
  EXPECT_EQ(error, std::string("--config: cannot read ") + path);
}

TEST(ProcessWatch, AWitnessVouchesOnlyOnceTrustedAndUntilTheProcessGoes) {
  uint16_t port = 0;
  const int listener = testing::listen_loopback(port);
  ASSERT_GE(listener, 0);
  ProcessWatch watch("http://127.0.0.1:" + std::to_string(port));
  EXPECT_FALSE(watch.same_process()) << "nothing armed";
  ASSERT_TRUE(watch.arm());
  // Armed before the check, so a restart during it is seen; not trusted until it passed:
  // a request arriving meanwhile must not take slot beliefs on the witness's word.
  EXPECT_FALSE(watch.same_process());
  watch.trust();
  EXPECT_TRUE(watch.same_process());
  EXPECT_TRUE(watch.renew()) << "a renewed witness keeps the trust";
  EXPECT_TRUE(watch.same_process());
  ASSERT_TRUE(watch.arm());
  EXPECT_FALSE(watch.same_process()) << "arming again starts a new check";
  watch.trust();
  close(listener);  // the process goes: its sockets close
  EXPECT_TRUE(testing::eventually("the witness sees the process gone",
                                  [&] { return !watch.same_process(); }));
  watch.trust();
  EXPECT_FALSE(watch.same_process()) << "trust never revives a closed witness";
}

TEST(SlotPool, TakesTheIdleSlotWithTheLongestCommonPrefix) {
  SlotPool pool;
  pool.resize(3);
  size_t common = 0;
  const uint32_t a = pool.acquire({1, 2, 3}, &common);
  const uint32_t b = pool.acquire({1, 2, 3}, &common);
  const uint32_t c = pool.acquire({1, 2, 3}, &common);
  pool.release(a, {1, 2, 9});
  pool.release(b, {1, 2, 3, 4});
  pool.release(c, {});
  EXPECT_EQ(pool.acquire({1, 2, 3, 4, 5}, &common), b);
  EXPECT_EQ(common, 4u);
  EXPECT_EQ(pool.acquire({1, 2, 3, 4, 5}, &common), a);
  EXPECT_EQ(common, 2u);
  EXPECT_EQ(pool.busy(), 2u);
}

TEST(SlotPool, LeastRecentlyUsedAmongEqualsAndVerifyDropsStaleBeliefs) {
  SlotPool pool;
  pool.resize(2);
  size_t common = 0;
  const uint32_t first = pool.acquire({}, &common);
  const uint32_t second = pool.acquire({}, &common);
  pool.release(first, {5, 6});
  pool.release(second, {5, 6});
  EXPECT_EQ(pool.acquire({5, 6}, &common), first);  // used longest ago
  pool.release(first, {5, 6});
  // The upstream restarted: slot `second` ran no task, slot `first` holds less.
  std::vector<SlotReport> reports(2);
  reports[first] = SlotReport{.known = true, .prompt_tokens = 1};
  reports[second] = SlotReport{.known = false, .prompt_tokens = 0};
  pool.verify(reports);
  pool.acquire({5, 6}, &common);
  EXPECT_EQ(common, 0u);
}

TEST(SlotPool, AcquireWaitsForARelease) {
  SlotPool pool;
  pool.resize(1);
  size_t common = 0;
  const uint32_t only = pool.acquire({1}, &common);
  std::atomic<pid_t> waiter_tid{0};
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    waiter_tid = testing::current_thread_id();
    size_t c = 0;
    EXPECT_EQ(pool.acquire({1}, &c), only);
    EXPECT_EQ(c, 1u);
    got = true;
  });
  // The waiter is inside acquire and asleep there, not merely not yet started.
  EXPECT_TRUE(testing::eventually("the waiter sleeps in acquire()", [&] {
    return waiter_tid != 0 && testing::thread_blocked_in_futex(waiter_tid);
  }));
  EXPECT_FALSE(got.load());
  pool.release(only, {1});
  waiter.join();
  EXPECT_TRUE(got.load());
}

TEST(SlotPool, AnEmptyPoolHasNoSlot) {
  SlotPool pool;
  size_t common = 7;
  EXPECT_EQ(pool.acquire({1}, &common), no_slot);
}

TEST(HeadFlights, OneLeadsTheOthersWaitUntilItFinishes) {
  HeadFlights flights;
  ASSERT_TRUE(flights.lead_or_wait(42, 10'000));
  EXPECT_TRUE(flights.lead_or_wait(43, 10'000));  // another head: its own leader
  std::atomic<int> returned{0};
  std::vector<std::atomic<pid_t>> tids(3);
  std::vector<std::thread> followers;
  for (int i = 0; i < 3; ++i)
    followers.emplace_back([&, i] {
      tids[i] = testing::current_thread_id();
      EXPECT_FALSE(flights.lead_or_wait(42, 60'000));
      ++returned;
    });
  // Every follower is asleep in lead_or_wait, so "none returned" means they wait.
  EXPECT_TRUE(testing::eventually("three followers sleep in lead_or_wait()", [&] {
    for (const auto& tid : tids)
      if (tid == 0 || !testing::thread_blocked_in_futex(tid)) return false;
    return true;
  }));
  EXPECT_EQ(returned.load(), 0);
  flights.finish(42);
  for (auto& t : followers) t.join();
  EXPECT_EQ(returned.load(), 3);
  EXPECT_TRUE(flights.lead_or_wait(42, 10'000));  // finished: the next one leads again
}

TEST(HeadFlights, AFollowerGivesUpAfterItsTimeout) {
  HeadFlights flights;
  ASSERT_TRUE(flights.lead_or_wait(1, 10'000));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(flights.lead_or_wait(1, 20));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20));
}

TEST(SlotFileSizes, TwoLengthsPredictTheNextAndAMissStartsOver) {
  SlotFileSizes sizes;
  EXPECT_EQ(sizes.predict(100), 0u);
  sizes.observe(100, 1000 + 100 * 48);
  EXPECT_EQ(sizes.predict(200), 0u);  // one length says nothing of the slope
  sizes.observe(100, 1000 + 100 * 48);
  EXPECT_EQ(sizes.predict(200), 0u);
  sizes.observe(300, 1000 + 300 * 48);
  EXPECT_EQ(sizes.predict(2000), 1000u + 2000 * 48);
  sizes.observe(50, 1000 + 50 * 48);  // agrees: the fit stands
  EXPECT_EQ(sizes.predict(10), 1000u + 10 * 48);
  sizes.observe(400, 7);  // disagrees (not linear): start over from this save
  EXPECT_EQ(sizes.predict(10), 0u);
  sizes.observe(400, 9);  // the same length with another size
  EXPECT_EQ(sizes.predict(10), 0u);
}

TEST(SlotFileSizes, NoPredictionWithoutWholeBytesPerToken) {
  SlotFileSizes sizes;
  sizes.observe(2, 10);
  sizes.observe(4, 13);
  EXPECT_EQ(sizes.predict(6), 0u);
}

TEST(EventSplitter, RewritesWholeEventsAcrossChunkBoundaries) {
  std::vector<std::string> seen;
  EventSplitter splitter([&](std::string event) {
    seen.push_back(event);
    return "<" + event + ">";
  });
  EXPECT_EQ(splitter.feed("data: {\"a\":1}\n"), "");
  EXPECT_EQ(splitter.feed("\ndata: {\"b\""), "<data: {\"a\":1}\n\n>");
  EXPECT_EQ(splitter.feed(":2}\n\ndata: [DONE]\n\n"), "<data: {\"b\":2}\n\n><data: [DONE]\n\n>");
  EXPECT_EQ(splitter.feed("tail"), "");
  EXPECT_EQ(splitter.flush(), "tail");
  EXPECT_EQ(seen.size(), 3u);
}

rapidjson::Document parsed(const char* json) {
  rapidjson::Document d;
  d.Parse(json);
  EXPECT_FALSE(d.HasParseError()) << json;
  return d;
}

TEST(PrefixKeys, AKeyCoversTheMessagesBeforeItAndEverythingElseRenderedButNotLaterMessages) {
  const auto one = parsed(R"({"model":"m","messages":[{"role":"system","content":"S"},)"
                          R"({"role":"user","content":"a"}],"stream":true})");
  const auto two = parsed(R"({"model":"m","messages":[{"role":"system","content":"S"},)"
                          R"({"role":"user","content":"b"},{"role":"assistant","content":"c"}]})");
  const auto tools = parsed(R"({"model":"m","tools":[{"type":"function"}],"messages":[)"
                            R"({"role":"system","content":"S"},{"role":"user","content":"a"}]})");
  const auto other_head = parsed(R"({"model":"m","messages":[{"role":"system","content":"T"},)"
                                 R"({"role":"user","content":"a"}]})");
  const PrefixKeys k1(one), k2(two), kt(tools), ko(other_head);
  EXPECT_EQ(k1.key(1, "user"), k2.key(1, "user")) << "later messages and stream do not count";
  EXPECT_NE(k1.key(1, "user"), k1.key(1, "assistant")) << "the role after the boundary counts";
  EXPECT_NE(k1.key(1, "user"), k1.key(2, "user"));
  EXPECT_NE(k1.key(1, "user"), kt.key(1, "user")) << "tools are rendered";
  EXPECT_NE(k1.key(1, "user"), ko.key(1, "user"));
  EXPECT_NE(k1.key(2, "assistant"), k2.key(2, "assistant")) << "the user messages differ";
  EXPECT_STREQ(k2.role(2), "assistant");

  PromptPrefixes prefixes;
  prefixes.remember(k1.key(1, "user"), {1, 2, 3});
  prefixes.remember(k1.key(2, "assistant"), {1, 2, 3, 4, 5});
  size_t keep = 0;
  auto found = prefixes.longest(k2, 1, &keep);  // messages[0,2) of `two` are not known
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(keep, 1u);
  EXPECT_EQ(found->size(), 3u);
  EXPECT_EQ(prefixes.longest(k2, 2, &keep), nullptr) << "none that covers keep_min";
}

TEST(PromptPrefixes, KeepsAtMostTheTokenCapDroppingTheOldestFirst) {
  constexpr size_t cap = limits::proxy_prefix_cache_tokens_max;
  PromptPrefixes prefixes;
  prefixes.remember(1, Tokens(cap + 1, 7));
  EXPECT_EQ(prefixes.find(1), nullptr) << "one prefix past the cap is not kept";
  EXPECT_EQ(prefixes.tokens(), 0u);
  prefixes.remember(2, Tokens(cap - 1, 7));
  prefixes.remember(3, Tokens(1, 7));
  EXPECT_EQ(prefixes.tokens(), cap) << "exactly the cap is kept";
  ASSERT_NE(prefixes.find(2), nullptr);
  prefixes.remember(4, Tokens(1, 7));  // cap + 1: the oldest goes
  EXPECT_EQ(prefixes.find(2), nullptr);
  EXPECT_NE(prefixes.find(3), nullptr);
  EXPECT_NE(prefixes.find(4), nullptr);
  EXPECT_EQ(prefixes.tokens(), 2u);
}

TEST(CommonPrefix, CountsMatchingLeadingTokens) {
  EXPECT_EQ(common_prefix({1, 2, 3}, {1, 2, 4}), 2u);
  EXPECT_EQ(common_prefix({}, {1}), 0u);
  EXPECT_EQ(common_prefix({1, 2}, {1, 2, 3}), 2u);
}

}  // namespace
}  // namespace kvpark::proxy
