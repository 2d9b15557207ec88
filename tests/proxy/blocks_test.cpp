// kvpark-proxy parking slot files as blocks (proxy/state_blocks.h), end to end: a head
// many conversations share is parked once, any block-aligned prefix of a parked
// conversation restores, a damaged block is never handed to llama-server, and an
// upstream whose cache layout changed is checked again.
#include <dirent.h>
#include <rapidjson/document.h>
#include <sys/stat.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "tests/proxy/proxy_e2e.h"
#include "tests/proxy/proxy_metrics.h"

namespace kvpark::testing {
namespace {

// The tokens llama-server's chat endpoint makes of `request`.
std::vector<int32_t> prompt_tokens_of(const std::string& server_url, const ChatRequest& request) {
  const HttpResult prompt = http_post(server_url, "/apply-template", chat_request_json(request));
  std::vector<int32_t> tokens;
  EXPECT_TRUE(tokenize(server_url, prompt_of(prompt.body), /*special=*/true, &tokens));
  return tokens;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// The slot directory's files whose names end in `suffix`, with their inode numbers.
std::map<std::string, ino_t> files_ending(const std::string& dir, const std::string& suffix) {
  std::map<std::string, ino_t> files;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return files;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    struct stat st;
    if (name != "." && name != ".." && name.ends_with(suffix) &&
        stat((dir + "/" + name).c_str(), &st) == 0)
      files[name] = st.st_ino;
  }
  closedir(d);
  return files;
}

class ProxyBlocks : public ProxyE2E {
 protected:
  ProxyProcess& start_block_proxy() {
    ProxyProcess& proxy = start_proxy();
    const ProxyStatus status = get_proxy_status(proxy.url());
    EXPECT_EQ(status.upstreams.at(0).parking, "blocks") << status.body;
    EXPECT_GT(status.upstreams.at(0).block_bytes, 0) << status.body;
    return proxy;
  }
  // KV bytes per token of the upstream's slot files.
  static uint64_t token_bytes(const ProxyProcess& proxy) {
    const ProxyUpstreamStatus u = get_proxy_status(proxy.url()).upstreams.at(0);
    return u.block_tokens > 0 ? uint64_t(u.block_bytes / u.block_tokens) : 0;
  }
};

// Four conversations over one head, two turns each: the head's blocks are parked once.
// Parked as whole files, each conversation's states hold the head again (the head, and
// every turn's closure from token 0): here kvparkd holds little more than the tokens
// the conversations do not share.
TEST_F(ProxyBlocks, SiblingConversationsParkTheirSharedHeadOnce) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_block_proxy();
  const std::string system = head_text(51);
  const int64_t head_tokens = count_tokens(server.url(), system);
  ASSERT_GT(head_tokens, 1000);
  constexpr int conversations = 4;
  int64_t own_tokens = 0;  // past the head, in every conversation: its turns and replies
  for (int c = 0; c < conversations; ++c) {
    std::vector<ChatMessage> messages = conversation(system, user_text(510 + c * 2));
    const ChatResult first = post_chat(proxy.url(), chat(messages));
    ASSERT_EQ(first.http.status, 200) << describe(first);
    messages.push_back({"assistant", first.content});
    messages.push_back({"user", user_text(511 + c * 2)});
    const ChatResult second = post_chat(proxy.url(), chat(messages));
    ASSERT_EQ(second.http.status, 200) << describe(second);
    // The second turn's prompt holds the first turn and its reply.
    own_tokens += second.prompt_tokens - head_tokens + 64;  // its reply, at most
  }
  // The head once, and every turn's closure.
  const int64_t publishes = 1 + 2 * conversations;
  EXPECT_EQ(wait_for_publishes(proxy, publishes).publishes, publishes);
  const uint64_t per_token = token_bytes(proxy);
  ASSERT_GT(per_token, 0u);
  const int64_t parked = daemon_status(daemon_, "arena_used_bytes");
  const uint64_t unique = uint64_t(head_tokens + own_tokens) * per_token;
  const uint64_t head_copies = uint64_t(conversations) * uint64_t(head_tokens) * per_token;
  std::printf("blocks: kvparkd holds %lld bytes for %llu bytes of unique state "
              "(%.2fx); the head %d times over would be %llu bytes\n",
              static_cast<long long>(parked), static_cast<unsigned long long>(unique),
              double(parked) / double(unique), conversations,
              static_cast<unsigned long long>(head_copies));
  EXPECT_GT(parked, 0);
  EXPECT_LT(uint64_t(parked), head_copies) << "the head is parked more than once";
  // Per conversation at most one partial block and one tail snapshot repeat what
  // another holds, and each payload is rounded to a page.
  const uint64_t slack = uint64_t(conversations) * 2 * 2 * 64 * per_token;
  EXPECT_LE(uint64_t(parked), unique + slack);
  EXPECT_GT(daemon_status(daemon_, "blocks"), head_tokens / 64);
  // Every saved slot file passed the checks for parking as blocks.
  EXPECT_EQ(metric(scrape(proxy.url()), "kvpark_proxy_slot_files_not_split_total"), 0);
}

// A conversation cut back and continued otherwise (a client that edits its last
// message) shares a long prefix with what was parked, past the head and short of any
// saved position: parked as blocks, that prefix restores to its last whole block.
TEST_F(ProxyBlocks, AConversationCutBackRestoresTheBlocksItShares) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_block_proxy();
  const std::string system = head_text(52);
  const std::string shared = english_text(300, 5201);  // ~1,200 tokens of one user turn
  const ChatRequest first = chat(conversation(system, shared + " First ending, please?"));
  const ChatResult a = post_chat(proxy.url(), first);
  ASSERT_EQ(a.http.status, 200) << describe(a);
  wait_for_publishes(proxy, 2);  // the head and the turn
  const ChatRequest edited = chat(conversation(system, shared + " Another ending, then?"));
  const size_t common = common_prefix(prompt_tokens_of(server.url(), first),
                                      prompt_tokens_of(server.url(), edited));
  const int64_t head_tokens = count_tokens(server.url(), system);
  ASSERT_GT(int64_t(common), head_tokens + 512);

  server.stop();  // nothing in any slot: the prefix can only come from kvparkd
  ASSERT_TRUE(server.start()) << server.log_tail();
  const ChatResult b = post_chat(proxy.url(), edited);
  ASSERT_EQ(b.http.status, 200) << describe(b);
  const int64_t restored = b.header_int("x-kvpark-restored-tokens");
  EXPECT_EQ(restored, int64_t(common / 64 * 64)) << describe(b);
  EXPECT_GT(restored, head_tokens + 448) << "only the head restored: " << describe(b);
  EXPECT_LE(b.prompt_n, b.prompt_tokens - restored + 1) << describe(b);
  EXPECT_EQ(b.cached_tokens, expected_cached_tokens(b)) << describe(b);
  const ChatResult direct = post_chat(server.url(), reference(edited));
  ASSERT_EQ(direct.http.status, 200) << describe(direct);
  EXPECT_EQ(b.content, direct.content);
}

// Blocks of the head parked by another client of kvparkd in the proxy's namespace,
// each damaged after it was sealed (as a buggy or hostile member of the kvpark group
// could): the proxy's verified read refuses them before llama-server sees a byte, the
// request is prefilled and answers as llama-server does directly.
TEST_F(ProxyBlocks, DamagedBlocksAreRefusedAndPrefilled) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_block_proxy();
  const std::string system = head_text(53);
  std::vector<int32_t> a;
  const size_t head = head_of(server.url(), system, &a).size();
  ASSERT_GT(head, 1000u);

  const ProxyUpstreamStatus u = get_proxy_status(proxy.url()).upstreams.at(0);
  const kvpark_namespace ns = proxy_namespace(u.space, "damaging-test", uint32_t(u.block_tokens),
                                              uint64_t(u.block_bytes));
  kvpark_client* client = nullptr;
  ASSERT_EQ(kvpark_connect(daemon_.socket_path().c_str(), &ns, &client), KVPARK_OK);
  const size_t blocks = head / size_t(u.block_tokens);
  const kvpark_publish_options options{.session_id = 1,
                                       .entry_class = KVPARK_CLASS_SHARED,
                                       .evidence = KVPARK_EVIDENCE_ENGINE_STRUCTURAL};
  kvpark_reservation* reservation = nullptr;
  ASSERT_EQ(kvpark_reserve_blocks(client, &options, a.data(), head, 0, blocks, &reservation),
            KVPARK_OK);
  std::vector<uint8_t*> payloads;
  for (size_t i = 0; i < blocks; ++i) {
    payloads.push_back(static_cast<uint8_t*>(kvpark_reservation_block(reservation, i)));
    ASSERT_NE(payloads.back(), nullptr);
    std::memset(payloads.back(), 0x3c, size_t(u.block_bytes));
  }
  ASSERT_EQ(kvpark_seal(reservation), KVPARK_OK);
  for (uint8_t* p : payloads) p[100] ^= 0x01;  // after sealing: a bit flip in each
  kvpark_disconnect(client);

  const ChatRequest request = chat(conversation(system, user_text(530)));
  const int64_t prefilled_before = prompt_tokens_total(server.url());
  const ChatResult via = post_chat(proxy.url(), request);
  ASSERT_EQ(via.http.status, 200) << describe(via);
  EXPECT_EQ(via.header_int("x-kvpark-restored-tokens"), 0) << describe(via);
  // By the request, or by the proxy ahead of it (it leads the head's flight).
  EXPECT_GE(prompt_tokens_total(server.url()) - prefilled_before, int64_t(head))
      << "the head must have been prefilled: " << describe(via);
  EXPECT_EQ(get_proxy_status(proxy.url()).restore_failures, 1);
  EXPECT_NE(proxy.log_tail().find("checksum mismatch"), std::string::npos) << proxy.log_tail();
  const ChatResult direct = post_chat(server.url(), reference(request));
  ASSERT_EQ(direct.http.status, 200) << describe(direct);
  EXPECT_EQ(via.content, direct.content);

  // kvparkd dropped the damaged blocks; the proxy parked the head anew, and a sibling
  // after a restart restores it.
  wait_for_publishes(proxy, 2);
  server.stop();
  ASSERT_TRUE(server.start()) << server.log_tail();
  const ChatRequest sibling = chat(conversation(system, user_text(531)));
  const ChatResult c = post_chat(proxy.url(), sibling);
  ASSERT_EQ(c.http.status, 200) << describe(c);
  EXPECT_EQ(c.header_int("x-kvpark-restored-tokens"), int64_t(head)) << describe(c);
  const ChatResult direct_c = post_chat(server.url(), reference(sibling));
  EXPECT_EQ(c.content, direct_c.content);
}

// A saved slot file, once parked, is kept as the spare while a slot has no restore
// file, and that slot's first restore writes over its pages instead of allocating a
// file's worth afresh (docs/proxy.md, "Restore path").
TEST_F(ProxyBlocks, ASlotsFirstRestoreWritesOverAParkedSavedFile) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_block_proxy();
  const std::string system = head_text(55);
  const ChatResult a = post_chat(proxy.url(), chat(conversation(system, user_text(540))));
  ASSERT_EQ(a.http.status, 200) << describe(a);
  wait_for_publishes(proxy, 2);  // the head and the turn's closure
  const auto spares = files_ending(slot_dir_, ".spare");
  ASSERT_EQ(spares.size(), 1u) << "one spare, kept while no slot has a restore file; files: "
                               << ::testing::PrintToString(files_ending(slot_dir_, ""));
  EXPECT_EQ(files_ending(slot_dir_, ""), spares) << "a saved file left behind";

  server.stop();
  ASSERT_TRUE(server.start()) << server.log_tail();
  const ChatRequest sibling = chat(conversation(system, user_text(541)));
  const ChatResult b = post_chat(proxy.url(), sibling);
  ASSERT_EQ(b.http.status, 200) << describe(b);
  EXPECT_GT(b.header_int("x-kvpark-restored-tokens"), 1000) << describe(b);
  const auto restores = files_ending(slot_dir_, ".restore");
  ASSERT_EQ(restores.size(), 1u);
  EXPECT_EQ(restores.begin()->second, spares.begin()->second)
      << "the slot's restore file is not the spare it took";
  const ChatResult direct = post_chat(server.url(), reference(sibling));
  ASSERT_EQ(direct.http.status, 200) << describe(direct);
  EXPECT_EQ(b.content, direct.content);
}

// llama-server restarted with another K cache type, the proxy not told: the first
// restore is refused, the round trip run again learns the new layout, and states are
// parked and restored as blocks of it, in a namespace of their own.
TEST_F(ProxyBlocks, AnUpstreamRestartedWithAnotherCacheTypeIsCheckedAgain) {
  LlamaServerProcess& server = start_server({"-ctk", "f16", "-ctv", "f16"}, wide_model_path());
  ProxyProcess& proxy = start_block_proxy();
  const ProxyUpstreamStatus before = get_proxy_status(proxy.url()).upstreams.at(0);
  const std::string system = head_text(54);
  const ChatResult a = post_chat(proxy.url(), chat(conversation(system, user_text(540))));
  ASSERT_EQ(a.http.status, 200) << describe(a);
  wait_for_publishes(proxy, 2);

  server.stop();
  server.config().extra_args = {"-ctk", "q8_0"};
  ASSERT_TRUE(server.start()) << server.log_tail();
  const ChatRequest second = chat(conversation(system, user_text(541)));
  const ChatResult b = post_chat(proxy.url(), second);
  ASSERT_EQ(b.http.status, 200) << describe(b);
  EXPECT_EQ(b.header_int("x-kvpark-restored-tokens"), 0) << describe(b);
  const ChatResult direct = post_chat(server.url(), reference(second));
  EXPECT_EQ(b.content, direct.content);
  ProxyUpstreamStatus after;
  ASSERT_TRUE(wait_until(
      [&] {
        after = get_proxy_status(proxy.url()).upstreams.at(0);
        return after.parking == "blocks" && after.block_bytes != before.block_bytes;
      },
      publish_wait_msec_max))
      << get_proxy_status(proxy.url()).body;
  EXPECT_LT(after.block_bytes, before.block_bytes) << "q8_0 K rows are smaller";
  EXPECT_NE(after.space, before.space);

  // Parked in the new layout: a sibling after a restart restores the head.
  const int64_t publishes = get_proxy_status(proxy.url()).publishes;
  const ChatResult c = post_chat(proxy.url(), chat(conversation(system, user_text(542))));
  ASSERT_EQ(c.http.status, 200) << describe(c);
  wait_for_publishes(proxy, publishes + 1);
  server.stop();
  ASSERT_TRUE(server.start()) << server.log_tail();
  const ChatRequest last = chat(conversation(system, user_text(543)));
  const ChatResult d = post_chat(proxy.url(), last);
  ASSERT_EQ(d.http.status, 200) << describe(d);
  EXPECT_GT(d.header_int("x-kvpark-restored-tokens"), 1000) << describe(d);
  const ChatResult direct_d = post_chat(server.url(), reference(last));
  EXPECT_EQ(d.content, direct_d.content);
}

}  // namespace
}  // namespace kvpark::testing
