// kvpark-proxy forwarding on known prefix tokens, against real llama-server: a
// sibling on the same server is forwarded with no render or tokenize round trip
// before, on the token ids of its head the proxy learned from an earlier request.
// The tests compare those ids with llama-server's own full tokenization of each
// request (contents that start with newlines, spaces, digits, punctuation; and,
// under a template that runs content straight into a word, contents the tokenizer
// merges across the boundary), and show that what is parked is keyed by the full
// tokenization: a later turn after a llama-server restart restores it. kvparkd
// counts as restored what the proxy restored.
#include "tests/proxy/proxy_e2e.h"
#include "tests/proxy/proxy_metrics.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

// llama-server's tokens for a chat request, as its chat endpoint makes them.
std::vector<int32_t> full_tokens(const std::string& url, const ChatRequest& request) {
  const HttpResult rendered = http_post(url, "/apply-template", chat_request_json(request));
  std::vector<int32_t> tokens;
  EXPECT_TRUE(tokenize(url, prompt_of(rendered.body), /*special=*/true, &tokens));
  return tokens;
}

// The head's tokens as the proxy learns them: what two renderings with stand-in
// user contents share.
std::vector<int32_t> head_frontier(const std::string& url, const std::string& system) {
  std::vector<int32_t> a = full_tokens(url, chat(conversation(system, "a")));
  const std::vector<int32_t> b = full_tokens(url, chat(conversation(system, "b")));
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  a.resize(n);
  return a;
}

bool opens(const std::vector<int32_t>& prefix, const std::vector<int32_t>& tokens) {
  return prefix.size() <= tokens.size() && std::equal(prefix.begin(), prefix.end(), tokens.begin());
}

class KnownPrefix : public ProxyE2E {
 protected:
  // Reference answers come from a llama-server of its own (same model, same
  // arguments): a direct request to the proxied one would change slots the proxy
  // counts on.
  std::string reference_url_;

  // A sibling through the proxy on the same server: forwarded on the head's known
  // tokens, prefilling only its own part, cached_tokens what was not prefilled, the
  // answer the direct one.
  ChatResult expect_forwarded_on_known_head(ProxyProcess& proxy, const std::string& system,
                                            const std::string& user) {
    const ChatRequest request = chat(conversation(system, user));
    const int64_t publishes = get_proxy_status(proxy.url()).publishes;
    const ChatResult r = post_chat(proxy.url(), request);
    EXPECT_EQ(r.http.status, 200) << describe(r);
    EXPECT_EQ(r.http.header("x-kvpark-forward-path"), "known_prefix") << describe(r);
    EXPECT_EQ(r.http.header("x-kvpark-reuse"), "slot") << describe(r);
    EXPECT_LT(r.prompt_n, 200) << "only the user's part is prefilled: " << describe(r);
    EXPECT_EQ(r.cached_tokens, r.prompt_tokens - r.prompt_n) << describe(r);
    EXPECT_EQ(r.header_int("x-kvpark-cached-tokens"), r.cached_tokens) << describe(r);
    wait_for_publishes(proxy, publishes + 1);  // its turn, parked after the response
    const ChatResult direct = post_chat(reference_url_, reference(request));
    EXPECT_EQ(r.content, direct.content) << describe(r);
    return r;
  }

  // Turn 2 of `turn1`'s conversation after a llama-server restart restores turn 1's
  // state from kvparkd (parked under its full tokenization) and kvparkd counts the
  // tokens the proxy restored as restored.
  void expect_turn_two_restored_after_restart(ProxyProcess& proxy, LlamaServerProcess& server,
                                              const std::string& system, const std::string& user,
                                              const ChatResult& turn1) {
    const int64_t restored_before = daemon_status(daemon_, "restored_tokens");
    const int64_t restorable_before = daemon_status(daemon_, "lookup_hit_tokens");
    server.stop();
    ASSERT_TRUE(server.start()) << server.log_tail();
    std::vector<ChatMessage> messages = conversation(system, user);
    messages.push_back({"assistant", turn1.content});
    messages.push_back({"user", user_text(99)});
    const ChatResult turn2 = post_chat(proxy.url(), chat(messages));
    ASSERT_EQ(turn2.http.status, 200) << describe(turn2);
    EXPECT_EQ(turn2.http.header("x-kvpark-reuse"), "private_turn_closure") << describe(turn2);
    const int64_t restored = turn2.header_int("x-kvpark-restored-tokens");
    EXPECT_GE(restored, turn1.prompt_tokens - token_slack) << describe(turn2);
    EXPECT_LE(turn2.prompt_n, turn2.prompt_tokens - turn1.prompt_tokens + token_slack)
        << describe(turn2);
    const ChatResult direct = post_chat(reference_url_, reference(chat(messages)));
    EXPECT_EQ(turn2.content, direct.content);
    // The lease is released one way: wait for kvparkd to count it.
    EXPECT_TRUE(wait_until(
        [&] { return daemon_status(daemon_, "restored_tokens") == restored_before + restored; },
        10'000))
        << "kvparkd restored_tokens " << daemon_status(daemon_, "restored_tokens") << ", expected "
        << restored_before + restored;
    EXPECT_GE(daemon_status(daemon_, "lookup_hit_tokens") - restorable_before, restored);
  }
};

TEST_F(KnownPrefix, SameServerSiblingsAreForwardedOnTheirHeadsTokens) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  reference_url_ = start_server().url();
  const std::string system = head_text(71);
  const ChatResult leader = post_chat(proxy.url(), chat(conversation(system, user_text(1))));
  ASSERT_EQ(leader.http.status, 200) << describe(leader);
  EXPECT_EQ(leader.http.header("x-kvpark-forward-path"), "full") << describe(leader);
  wait_for_publishes(proxy, 2);  // the head and the leader's turn

  const std::vector<int32_t> head = head_frontier(server.url(), system);
  ASSERT_GT(head.size(), 1000u);
  const std::vector<std::string> users = {user_text(2), "\n\nNewlines first. " + user_text(3),
                                          " A leading space. " + user_text(4),
                                          "12345 digits first", ".dot, then words"};
  ChatResult last;
  for (const std::string& user : users) {
    // The proxy's known tokens are the head's: they open llama-server's own
    // tokenization of each request, boundary included.
    EXPECT_TRUE(opens(head, full_tokens(server.url(), chat(conversation(system, user)))))
        << "content " << user;
    last = expect_forwarded_on_known_head(proxy, system, user);
  }
  const PromDocument doc = scrape(proxy.url());
  EXPECT_EQ(metric(doc, "kvpark_proxy_forwarded_total", {{"path", "known_prefix"}}),
            double(users.size()));
  EXPECT_EQ(metric(doc, "kvpark_proxy_prefix_mismatches_total"), 0);
  EXPECT_EQ(metric(doc, "kvpark_proxy_forward_delay_seconds_count"), double(users.size() + 1));

  // The last sibling's slot still holds its prompt: only knowing that llama-server
  // restarted keeps the proxy from trusting it.
  expect_turn_two_restored_after_restart(proxy, server, system, users.back(), last);
}

// A template that runs the content straight into a word ("...some" + content): a
// content starting "r" or "d" merges with the template's last letter ("er", "ed"),
// so the head's known tokens do not open that request's tokenization. The request
// is still forwarded on them (a wrong guess costs llama-server a few tokens of
// prefill, never a wrong answer: it matches its cache itself), the mismatch is
// counted, and what is parked is keyed by the full tokenization.
TEST_F(KnownPrefix, AMergeAcrossTheBoundaryIsCaughtAndParkedByTheFullTokens) {
  const std::string merging_template =
      "{% for m in messages %}<|im_start|>{{ m.role }}\nsome{{ m.content }}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  LlamaServerProcess& server = start_server({"--jinja", "--chat-template", merging_template});
  ProxyProcess& proxy = start_proxy();
  reference_url_ = start_server({"--jinja", "--chat-template", merging_template}).url();
  const std::string system = head_text(72);
  const ChatResult leader = post_chat(proxy.url(), chat(conversation(system, user_text(1))));
  ASSERT_EQ(leader.http.status, 200) << describe(leader);
  wait_for_publishes(proxy, 2);

  const std::vector<int32_t> head = head_frontier(server.url(), system);
  const std::string merging = "rror is what this content starts with";
  ASSERT_FALSE(opens(head, full_tokens(server.url(), chat(conversation(system, merging)))))
      << "the template no longer merges across the boundary";
  EXPECT_TRUE(opens(head, full_tokens(server.url(), chat(conversation(system, user_text(2))))));

  expect_forwarded_on_known_head(proxy, system, user_text(3));
  EXPECT_EQ(metric(scrape(proxy.url()), "kvpark_proxy_prefix_mismatches_total"), 0);

  const ChatRequest request = chat(conversation(system, merging));
  const int64_t publishes = get_proxy_status(proxy.url()).publishes;
  const ChatResult r = post_chat(proxy.url(), request);
  ASSERT_EQ(r.http.status, 200) << describe(r);
  EXPECT_EQ(r.http.header("x-kvpark-forward-path"), "known_prefix") << describe(r);
  EXPECT_LT(r.prompt_n, 200) << describe(r);
  EXPECT_EQ(r.cached_tokens, r.prompt_tokens - r.prompt_n) << describe(r);
  wait_for_publishes(proxy, publishes + 1);
  EXPECT_EQ(r.content, post_chat(reference_url_, reference(request)).content);
  EXPECT_EQ(metric(scrape(proxy.url()), "kvpark_proxy_prefix_mismatches_total"), 1);
  expect_turn_two_restored_after_restart(proxy, server, system, merging, r);
}

}  // namespace
}  // namespace kvpark::testing
