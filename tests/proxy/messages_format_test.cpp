// proxy/messages_format.cpp: Anthropic Messages requests as llama-server's Chat Completions
// bodies, Chat Completions answers and streams back as Messages, Anthropic error bodies.
#include <gtest/gtest.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <string>
#include <vector>

#include "proxy/json.h"
#include "proxy/wire_formats.h"

namespace kvpark::proxy {
namespace {

rapidjson::Document parse(const std::string& text) {
  rapidjson::Document doc;
  EXPECT_EQ(parse_json(text, doc), JsonStatus::ok) << text;
  return doc;
}

std::string dump(const rapidjson::Value& v) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  v.Accept(w);
  return buffer.GetString();
}

// The Chat Completions body for `body`; `normalized` counts billing headers changed.
rapidjson::Document convert(const std::string& body, bool normalize = true,
                            int* normalized = nullptr) {
  rapidjson::Document chat;
  std::string error;
  int count = -1;
  EXPECT_TRUE(messages_to_chat(parse(body), normalize, chat, &count, &error)) << error;
  if (normalized != nullptr) *normalized = count;
  return chat;
}

std::string messages_of(const std::string& body) {
  return dump(convert(body)["messages"]);
}

TEST(MessagesToChat, SystemStringBecomesTheLeadingSystemMessage) {
  EXPECT_EQ(
      messages_of(R"({"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]})"),
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}])");
}

TEST(MessagesToChat, SystemTextBlocksAreJoinedWithNoSeparatorAndOthersSkipped) {
  EXPECT_EQ(messages_of(R"({"system": [{"type": "text", "text": "One."}, {"type": "image"},
                                       {"type": "text", "text": "Two."}], "messages": []})"),
            R"([{"role":"system","content":"One.Two."}])");
  EXPECT_EQ(messages_of(R"({"system": null, "messages": []})"), "[]");
}

constexpr char billing[] = "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are Claude.";
constexpr char billing_normal[] =
    "x-anthropic-billing-header: cc_version=2.1; cch=fffff;You are Claude.";

std::string billing_body(const std::string& first, const std::string& second) {
  return R"({"system": [{"type": "text", "text": ")" + first + R"("}, {"type": "text", "text": ")" +
         second + R"("}], "messages": []})";
}

TEST(MessagesToChat, BillingHeaderStampIsNormalizedAndCounted) {
  int normalized = 0;
  rapidjson::Document chat = convert(billing_body(billing, billing), true, &normalized);
  EXPECT_EQ(normalized, 2);
  EXPECT_EQ(std::string(chat["messages"][0]["content"].GetString()),
            std::string(billing_normal) + billing_normal);
  chat = convert(R"({"system": ")" + std::string(billing) + R"(", "messages": []})", true,
                 &normalized);
  EXPECT_EQ(normalized, 1);
  EXPECT_STREQ(chat["messages"][0]["content"].GetString(), billing_normal);
  convert(billing_body(billing_normal, "plain"), true, &normalized);
  EXPECT_EQ(normalized, 0) << "an already normal stamp changes nothing";
  chat = convert(billing_body("x-anthropic-billing-header: cch=a5145;", ""), true, &normalized);
  EXPECT_EQ(normalized, 1) << "the ';' may end the text";
  EXPECT_STREQ(chat["messages"][0]["content"].GetString(),
               "x-anthropic-billing-header: cch=fffff;");
}

TEST(MessagesToChat, BillingHeaderIsLeftAloneWithoutNormalize) {
  int normalized = -1;
  rapidjson::Document chat = convert(billing_body(billing, ""), false, &normalized);
  EXPECT_EQ(normalized, 0);
  EXPECT_STREQ(chat["messages"][0]["content"].GetString(), billing);
}

TEST(MessagesToChat, BillingHeaderIsLeftAloneUnlessASemicolonFollowsTheFiveCharacters) {
  int normalized = -1;
  const std::string six = "x-anthropic-billing-header: cch=a51456;rest";
  const std::string at_end = "x-anthropic-billing-header: cch=a5145";  // no ';' at all
  const std::string not_first = " x-anthropic-billing-header: cch=a5145;rest";
  rapidjson::Document chat = convert(billing_body(six, at_end), true, &normalized);
  EXPECT_EQ(normalized, 0);
  EXPECT_EQ(chat["messages"][0]["content"].GetString(), six + at_end);
  convert(billing_body(not_first, "cch=a5145;x"), true, &normalized);
  EXPECT_EQ(normalized, 0);
}

std::string arguments_of(const std::string& input) {
  rapidjson::Document chat = convert(
      R"({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
          "name": "f")" +
      (input.empty() ? "" : R"(, "input": )" + input) + "}]}]}");
  return chat["messages"][0]["tool_calls"][0]["function"]["arguments"].GetString();
}

TEST(MessagesToChat, ToolUseArgumentsAreCompactWithKeysSortedAsNlohmannDumps) {
  EXPECT_EQ(arguments_of(R"({"z": 1, "a": {"y": [1, -2, "x\ny\u0001"], "b": null}, "m": true})"),
            R"({"a":{"b":null,"y":[1,-2,"x\ny\u0001"]},"m":true,"z":1})");
  EXPECT_EQ(arguments_of(""), "{}");
  EXPECT_EQ(arguments_of("null"), "{}");
  EXPECT_EQ(arguments_of(R"({"a": 1, "a": 2})"), R"({"a":2})") << "the last duplicate wins";
  EXPECT_EQ(arguments_of(R"({"B": 0, "a": 0, "_": 0})"), R"({"B":0,"_":0,"a":0})");
  EXPECT_EQ(arguments_of("[1.0, 2.5, 0.0001, 1e-5, 1e14, 1e15, 1e20, -0.0, 1.5e300]"),
            "[1.0,2.5,0.0001,1e-05,100000000000000.0,1e+15,1e+20,-0.0,1.5e+300]");
  EXPECT_EQ(arguments_of(R"({"path": "a/b\\c\"d"})"), R"({"path":"a/b\\c\"d"})");
}

TEST(MessagesToChat, AssistantBlocksBecomeContentToolCallsAndReasoning) {
  rapidjson::Document chat = convert(R"({"messages": [
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
      {"type": "tool_use", "id": "t1", "name": "ls", "input": {"dir": "/"}}]},
    {"role": "assistant"},
    {"role": "user"},
    {"role": "assistant", "content": [{"type": "text", "text": "a"},
      {"type": "image", "source": {"type": "base64", "data": "AAA"}},
      {"type": "image", "source": {"type": "url", "url": "http://x/i.png"}},
      {"type": "image", "source": {"type": "file"}}]},
    {"role": "user", "content": []}]})");
  EXPECT_EQ(dump(chat["messages"]),
            R"([{"role":"assistant","content":"","tool_calls":[{"id":"t1","type":"function",)"
            R"("function":{"name":"ls","arguments":"{\"dir\":\"/\"}"}}],"reasoning_content":"hm"},)"
            R"({"role":"user"},)"
            R"({"role":"assistant","content":[{"type":"text","text":"a"},)"
            R"({"type":"image_url","image_url":{"url":"data:image/jpeg;base64,AAA"}},)"
            R"({"type":"image_url","image_url":{"url":"http://x/i.png"}}]}])");
}

TEST(MessagesToChat, ToolResultsBecomeToolMessagesAfterTheirMessage) {
  rapidjson::Document chat = convert(R"({"messages": [{"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "a", "content": "one"},
    {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "t"},
                                                           {"type": "text", "text": "wo"}]},
    {"type": "tool_result", "tool_use_id": "c", "content": [{"type": "text", "text": "see"},
      {"type": "image", "source": {"type": "url", "url": "u"}}]},
    {"type": "tool_result", "tool_use_id": "d"},
    {"type": "text", "text": "next"}]}]})");
  EXPECT_EQ(dump(chat["messages"]),
            R"([{"role":"user","content":[{"type":"text","text":"next"}]},)"
            R"({"role":"tool","tool_call_id":"a","content":"one"},)"
            R"({"role":"tool","tool_call_id":"b","content":"two"},)"
            R"({"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"see"},)"
            R"({"type":"image_url","image_url":{"url":"u"}}]},)"
            R"({"role":"tool","tool_call_id":"d","content":""}])");
}

TEST(MessagesToChat, CacheControlMarksLandOnTheChatObjectsTheyBecome) {
  rapidjson::Document chat = convert(R"({
    "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "a"}, {"name": "b", "cache_control": {"type": "ephemeral"}}],
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "q"},
        {"type": "image", "source": {"type": "url", "url": "u"},
         "cache_control": {"type": "ephemeral"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": "x",
         "cache_control": {"type": "ephemeral"}},
        {"type": "tool_result", "tool_use_id": "b", "content": "y"}]},
      {"role": "user", "cache_control": {"type": "ephemeral"}, "content": [
        {"type": "tool_result", "tool_use_id": "c", "content": "z"},
        {"type": "tool_result", "tool_use_id": "d", "content": "w"}]},
      {"role": "user", "content": [{"type": "text", "text": "plain"}]}]})");
  const rapidjson::Value& m = chat["messages"];
  ASSERT_EQ(m.Size(), 7u);
  const auto marked = [](const rapidjson::Value& v) {
    return v.HasMember("cache_control") && dump(v["cache_control"]) == R"({"type":"ephemeral"})";
  };
  EXPECT_TRUE(marked(m[0])) << "the system message";
  EXPECT_TRUE(marked(m[1])) << "a message with a marked image";
  EXPECT_TRUE(marked(m[2])) << "the marked tool_result's tool message";
  EXPECT_FALSE(m[3].HasMember("cache_control"));
  EXPECT_FALSE(m[4].HasMember("cache_control"));
  EXPECT_TRUE(marked(m[5])) << "a marked message: its last chat message";
  EXPECT_FALSE(m[6].HasMember("cache_control"));
  EXPECT_FALSE(chat["tools"][0].HasMember("cache_control"));
  EXPECT_TRUE(marked(chat["tools"][1]));
}

TEST(MessagesToChat, ToolsChoiceAndSamplingMembersAreConverted) {
  rapidjson::Document chat = convert(R"({"messages": [],
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}},
              {"name": "g"}],
    "tool_choice": {"type": "any"}, "stop_sequences": ["END"], "temperature": 0.5,
    "top_k": 3, "stream": true, "thinking": {"type": "enabled"},
    "metadata": {"user_id": "u1"}, "unknown": 1})");
  EXPECT_EQ(dump(chat["tools"]),
            R"([{"type":"function","function":{"name":"f","description":"d",)"
            R"("parameters":{"type":"object"}}},)"
            R"({"type":"function","function":{"name":"g","description":"","parameters":{}}}])");
  EXPECT_STREQ(chat["tool_choice"].GetString(), "required");
  EXPECT_EQ(dump(chat["stop"]), R"(["END"])");
  EXPECT_EQ(chat["max_tokens"].GetInt(), 4096);
  EXPECT_EQ(chat["temperature"].GetDouble(), 0.5);
  EXPECT_EQ(chat["top_k"].GetInt(), 3);
  EXPECT_TRUE(chat["stream"].GetBool());
  EXPECT_EQ(chat["thinking_budget_tokens"].GetInt(), 10000);
  EXPECT_STREQ(chat["__metadata_user_id"].GetString(), "u1");
  EXPECT_FALSE(chat.HasMember("unknown"));
  chat = convert(R"({"messages": [], "tool_choice": {"type": "auto"}, "max_tokens": 7,
                     "thinking": {"type": "enabled", "budget_tokens": 99}})");
  EXPECT_STREQ(chat["tool_choice"].GetString(), "auto");
  EXPECT_EQ(chat["max_tokens"].GetInt(), 7);
  EXPECT_EQ(chat["thinking_budget_tokens"].GetInt(), 99);
  chat = convert(R"({"messages": [], "tool_choice": {"type": "none"}, "thinking": {}})");
  EXPECT_FALSE(chat.HasMember("tool_choice"));
  EXPECT_FALSE(chat.HasMember("thinking_budget_tokens"));
  EXPECT_FALSE(chat.HasMember("tools"));
}

TEST(MessagesToChat, RefusesABodyWithoutMessagesOrNotAnObjectAndLeavesTheOutputAlone) {
  rapidjson::Document chat = parse(R"({"kept": true})");
  std::string error;
  int normalized = -1;
  EXPECT_FALSE(messages_to_chat(parse(R"({"system": "s"})"), true, chat, &normalized, &error));
  EXPECT_EQ(error, "'messages' is required");
  EXPECT_FALSE(messages_to_chat(parse("[]"), true, chat, &normalized, &error));
  EXPECT_EQ(error, "request body: expected a JSON object");
  EXPECT_EQ(dump(chat), R"({"kept":true})");
  EXPECT_EQ(normalized, -1);
}

const MessagesUsage usage{.input_tokens = 10,
                          .cache_read_input_tokens = 90,
                          .cache_creation_input_tokens = 5,
                          .output_tokens = 7};
constexpr char usage_json[] = R"({"input_tokens":10,"cache_creation_input_tokens":5,)"
                              R"("cache_read_input_tokens":90,"output_tokens":7})";

TEST(ChatAnswerToMessage, WritesThinkingTextAndToolUseBlocksAsLlamaServerDoes) {
  std::string body;
  ASSERT_TRUE(chat_answer_to_message(parse(R"({"id": "chatcmpl-1", "model": "m",
    "choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant",
      "content": "Looking.", "reasoning_content": "think",
      "tool_calls": [{"id": "c1", "type": "function",
                      "function": {"name": "ls", "arguments": "{\"dir\": \"/\"}"}},
                     {"id": "c2", "type": "function",
                      "function": {"name": "bad", "arguments": "{not json"}}]}}],
    "usage": {"prompt_tokens": 105}})"),
                                     usage, &body));
  EXPECT_EQ(body, std::string(R"({"id":"chatcmpl-1","type":"message","role":"assistant",)"
                              R"("content":[{"type":"thinking","thinking":"think","signature":""},)"
                              R"({"type":"text","text":"Looking."},)"
                              R"({"type":"tool_use","id":"c1","name":"ls","input":{"dir":"/"}},)"
                              R"({"type":"tool_use","id":"c2","name":"bad","input":{}}],)"
                              R"("model":"m","stop_reason":"tool_use","stop_sequence":null,)"
                              R"("usage":)") +
                      usage_json + "}");
}

TEST(ChatAnswerToMessage, MapsFinishReasonsAndRefusesAnAnswerWithoutAMessage) {
  const auto stop_reason = [](const char* finish_reason, const char* tool_calls) {
    std::string body;
    EXPECT_TRUE(chat_answer_to_message(
        parse(std::string(R"({"choices": [{"finish_reason": ")") + finish_reason +
              R"(", "message": {"content": null)" + tool_calls + "}}]}"),
        MessagesUsage{}, &body));
    return std::string(parse(body)["stop_reason"].GetString());
  };
  EXPECT_EQ(stop_reason("stop", ""), "end_turn");
  EXPECT_EQ(stop_reason("stop", R"(, "tool_calls": [{"function": {"name": "f"}}])"), "tool_use");
  EXPECT_EQ(stop_reason("length", ""), "max_tokens");
  EXPECT_EQ(stop_reason("tool_calls", ""), "tool_use");
  std::string body = "untouched";
  EXPECT_FALSE(chat_answer_to_message(parse(R"({"choices": []})"), usage, &body));
  EXPECT_FALSE(chat_answer_to_message(parse(R"({"choices": [{}]})"), usage, &body));
  EXPECT_FALSE(chat_answer_to_message(parse("[]"), usage, &body));
  EXPECT_EQ(body, "untouched");
}

struct Event {
  std::string name;
  rapidjson::Document data;
};

// The events of a Messages stream, each checked to be "event: NAME\ndata: JSON\n\n".
std::vector<Event> events_of(const std::string& stream) {
  std::vector<Event> events;
  size_t at = 0;
  while (at < stream.size()) {
    const size_t end = stream.find("\n\n", at);
    const size_t newline = stream.find('\n', at);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    EXPECT_EQ(stream.compare(at, 7, "event: "), 0);
    EXPECT_EQ(stream.compare(newline + 1, 6, "data: "), 0);
    Event e{stream.substr(at + 7, newline - at - 7),
            parse(stream.substr(newline + 7, end - newline - 7))};
    EXPECT_EQ(e.name, e.data["type"].GetString()) << "an event's name is its data's type";
    events.push_back(std::move(e));
    at = end + 2;
  }
  return events;
}

// What `chunks` (Chat Completions chunk JSON) stream as, finished with `usage`.
std::vector<Event> stream_of(const std::vector<std::string>& chunks) {
  MessagesStream stream;
  std::string text;
  for (const std::string& chunk : chunks) text += stream.on_chunk(parse(chunk));
  text += stream.finish(usage);
  EXPECT_EQ(stream.finish(usage), "") << "finished once";
  EXPECT_EQ(stream.on_chunk(parse(chunks.front())), "") << "nothing after finishing";
  return events_of(text);
}

std::string chunk(const std::string& delta, const std::string& finish_reason = "null") {
  return R"({"id": "chatcmpl-x", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": )" +
         delta + R"(, "finish_reason": )" + finish_reason + "}]}";
}

const std::string first_chunk = chunk(R"({"role": "assistant", "content": null})");
const std::string usage_chunk =
    R"({"id": "chatcmpl-x", "choices": [], "usage": {"prompt_tokens": 105}, "timings": {}})";

// "name" or "name:delta type" per event.
std::vector<std::string> shape_of(const std::vector<Event>& events) {
  std::vector<std::string> shape;
  for (const Event& e : events) {
    std::string s = e.name;
    if (e.data.HasMember("content_block"))
      s += std::string(":") + e.data["content_block"]["type"].GetString();
    if (e.data.HasMember("delta") && e.data["delta"].HasMember("type"))
      s += std::string(":") + e.data["delta"]["type"].GetString();
    if (e.data.HasMember("index")) s += "@" + std::to_string(e.data["index"].GetInt());
    shape.push_back(s);
  }
  return shape;
}

// The concatenated `key` of the deltas of type `type`.
std::string deltas(const std::vector<Event>& events, const char* type, const char* key) {
  std::string text;
  for (const Event& e : events) {
    if (e.name == "content_block_delta" && std::string(e.data["delta"]["type"].GetString()) == type)
      text += e.data["delta"][key].GetString();
  }
  return text;
}

TEST(MessagesStream, TextOnlyStreamsOneTextBlockBetweenStartAndStop) {
  const std::vector<Event> events =
      stream_of({first_chunk, chunk(R"({"content": "Hel"})"), chunk(R"({"content": ""})"),
                 chunk(R"({"content": "lo"})"), chunk("{}", R"("stop")"), usage_chunk});
  EXPECT_EQ(shape_of(events),
            (std::vector<std::string>{"message_start", "content_block_start:text@0",
                                      "content_block_delta:text_delta@0",
                                      "content_block_delta:text_delta@0", "content_block_stop@0",
                                      "message_delta", "message_stop"}));
  EXPECT_EQ(deltas(events, "text_delta", "text"), "Hello");
  EXPECT_EQ(dump(events[0].data),
            R"({"type":"message_start","message":{"id":"chatcmpl-x","type":"message",)"
            R"("role":"assistant","content":[],"model":"m","stop_reason":null,)"
            R"("stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}})");
  EXPECT_EQ(dump(events[1].data["content_block"]), R"({"type":"text","text":""})");
  EXPECT_EQ(dump(events[5].data), std::string(R"({"type":"message_delta","delta":)"
                                              R"({"stop_reason":"end_turn","stop_sequence":null},)"
                                              R"("usage":)") +
                                      usage_json + "}");
}

TEST(MessagesStream, ReasoningThenTextStopsTheThinkingBlockWithASignature) {
  const std::vector<Event> events =
      stream_of({first_chunk, chunk(R"({"reasoning_content": "Let me "})"),
                 chunk(R"({"reasoning_content": "think."})"), chunk(R"({"content": "Done."})"),
                 chunk("{}", R"("length")")});
  EXPECT_EQ(
      shape_of(events),
      (std::vector<std::string>{
          "message_start", "content_block_start:thinking@0", "content_block_delta:thinking_delta@0",
          "content_block_delta:thinking_delta@0", "content_block_delta:signature_delta@0",
          "content_block_stop@0", "content_block_start:text@1", "content_block_delta:text_delta@1",
          "content_block_stop@1", "message_delta", "message_stop"}));
  EXPECT_EQ(deltas(events, "thinking_delta", "thinking"), "Let me think.");
  EXPECT_EQ(deltas(events, "text_delta", "text"), "Done.");
  EXPECT_STREQ(events[4].data["delta"]["signature"].GetString(), "");
  EXPECT_STREQ(events[9].data["delta"]["stop_reason"].GetString(), "max_tokens");
}

TEST(MessagesStream, AToolCallInThreePiecesIsOneToolUseBlock) {
  const std::vector<Event> events = stream_of(
      {first_chunk, chunk(R"({"content": "Sure."})"),
       chunk(R"({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                  "function": {"name": "ls", "arguments": "{\"di"}}]})"),
       chunk(R"({"tool_calls": [{"index": 0, "function": {"arguments": "r\": "}}]})"),
       chunk(R"({"tool_calls": [{"index": 0, "function": {"arguments": "\"/\"}"}}]})"),
       chunk(R"({"tool_calls": [{"index": 1, "id": "call_2", "function": {"name": "pwd"}}]})"),
       chunk("{}", R"("stop")"), usage_chunk});
  EXPECT_EQ(shape_of(events),
            (std::vector<std::string>{
                "message_start", "content_block_start:text@0", "content_block_delta:text_delta@0",
                "content_block_stop@0", "content_block_start:tool_use@1",
                "content_block_delta:input_json_delta@1", "content_block_delta:input_json_delta@1",
                "content_block_delta:input_json_delta@1", "content_block_stop@1",
                "content_block_start:tool_use@2", "content_block_stop@2", "message_delta",
                "message_stop"}));
  EXPECT_EQ(dump(events[4].data["content_block"]),
            R"({"type":"tool_use","id":"call_1","name":"ls","input":{}})");
  EXPECT_EQ(deltas(events, "input_json_delta", "partial_json"), R"({"dir": "/"})");
  EXPECT_STREQ(events[11].data["delta"]["stop_reason"].GetString(), "tool_use")
      << "finish_reason stop with tool calls";
}

TEST(MessagesStream, FinishWithoutChunksStillWritesAWellFormedMessage) {
  MessagesStream stream;
  EXPECT_EQ(stream.on_chunk(parse(usage_chunk)), "") << "a chunk without choices";
  EXPECT_FALSE(stream.started());
  const std::vector<Event> events = events_of(stream.finish(usage));
  EXPECT_EQ(shape_of(events),
            (std::vector<std::string>{"message_start", "message_delta", "message_stop"}));
  EXPECT_STREQ(events[0].data["message"]["id"].GetString(), "");
}

TEST(MessagesErrors, WritesAnthropicErrorBodies) {
  EXPECT_EQ(messages_error_body("invalid_request_error", "bad \"x\""),
            R"({"type":"error","error":{"type":"invalid_request_error","message":"bad \"x\""}})");
  EXPECT_STREQ(messages_error_type(400), "invalid_request_error");
  EXPECT_STREQ(messages_error_type(401), "authentication_error");
  EXPECT_STREQ(messages_error_type(403), "permission_error");
  EXPECT_STREQ(messages_error_type(404), "not_found_error");
  EXPECT_STREQ(messages_error_type(413), "request_too_large");
  EXPECT_STREQ(messages_error_type(429), "rate_limit_error");
  EXPECT_STREQ(messages_error_type(503), "overloaded_error");
  EXPECT_STREQ(messages_error_type(502), "api_error");
  EXPECT_STREQ(messages_error_type(500), "api_error");
}

TEST(MessagesErrors, KeepsAnOpenAiErrorsMessageAndNamesAnythingElse) {
  EXPECT_EQ(messages_error_from_openai(
                400, R"({"error": {"code": 400, "message": "too long", "type": "x"}})"),
            messages_error_body("invalid_request_error", "too long"));
  const rapidjson::Document other = parse(messages_error_from_openai(500, "<html>oops</html>"));
  EXPECT_STREQ(other["error"]["type"].GetString(), "api_error");
  EXPECT_NE(std::string(other["error"]["message"].GetString()).find("<html>oops</html>"),
            std::string::npos);
  const std::string long_body(10000, 'x');
  EXPECT_LT(messages_error_from_openai(502, long_body).size(), 1000u) << "quoted, not copied";
}

TEST(ApiString, NamesEachApi) {
  EXPECT_STREQ(api_string(Api::chat_completions), "chat_completions");
  EXPECT_STREQ(api_string(Api::responses), "responses");
  EXPECT_STREQ(api_string(Api::messages), "messages");
}

TEST(MessagesIgnoredFields, NamesWhatTheConverterLeavesOut) {
  rapidjson::Document body;
  body.Parse(R"({"model":"m","max_tokens":8,"messages":[],"service_tier":"auto",)"
             R"("system":"s","mcp_servers":[],"stream":true})");
  EXPECT_EQ(messages_ignored_fields(body),
            (std::vector<std::string>{"service_tier", "mcp_servers"}));
  rapidjson::Document plain;
  plain.Parse(R"({"model":"m","messages":[],"metadata":{"user_id":"u"},"thinking":{}})");
  EXPECT_TRUE(messages_ignored_fields(plain).empty());
}

}  // namespace
}  // namespace kvpark::proxy
