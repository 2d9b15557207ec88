// proxy/wire_formats.h, OpenAI Responses: the Chat Completions body llama-server would
// convert a /v1/responses request to, its refusals word for word, and the usage figures.
#include "proxy/json.h"
#include "proxy/wire_formats.h"

#include <gtest/gtest.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <string>

namespace kvpark::proxy {
namespace {

rapidjson::Document parsed(const std::string& text) {
  rapidjson::Document doc;
  EXPECT_EQ(parse_json(text, doc), JsonStatus::ok) << text;
  return doc;
}

std::string serialized(const rapidjson::Value& value) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
  value.Accept(writer);
  return buffer.GetString();
}

// The chat body for `body`, which must convert.
rapidjson::Document chat_of(const std::string& body) {
  rapidjson::Document chat;
  std::string error;
  EXPECT_TRUE(responses_to_chat(parsed(body), chat, &error)) << error;
  return chat;
}

// Compares as JSON values: member order does not matter (llama-server re-parses the body).
void expect_json(const rapidjson::Value& actual, const std::string& expected) {
  EXPECT_EQ(actual, parsed(expected)) << serialized(actual);
}

// Why `body` is refused; "" when it converts. The output document stays untouched.
std::string refusal_of(const std::string& body) {
  rapidjson::Document chat;
  chat.SetString("untouched");
  std::string error;
  if (responses_to_chat(parsed(body), chat, &error)) return "";
  EXPECT_TRUE(chat.IsString());
  return error;
}

TEST(ResponsesToChat, InstructionsLeadAsSystemAndStringInputIsOneUserMessage) {
  const auto chat = chat_of(R"({"model":"m","instructions":"Be brief.","input":"Hi",
                                "stream":true,"temperature":0.5})");
  expect_json(chat, R"({"model":"m","stream":true,"temperature":0.5,"messages":[
      {"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]})");
}

TEST(ResponsesToChat, InstructionsThatAreNotAStringGiveAnEmptySystemMessage) {
  expect_json(chat_of(R"({"instructions":null,"input":"Hi"})"),
              R"({"messages":[{"role":"system","content":""},{"role":"user","content":"Hi"}]})");
}

TEST(ResponsesToChat, InputMessagesKeepTheirRoleWithTextParts) {
  const auto chat = chat_of(R"({"input":[
      {"role":"system","content":"S"},
      {"type":"message","role":"developer","content":"D","status":"completed"},
      {"role":"user","content":[{"type":"input_text","text":"U1"},
                                {"type":"input_image","image_url":"data:x"},
                                {"type":"input_text","text":"U2"}],"name":"bob"}]})");
  expect_json(chat, R"({"messages":[
      {"role":"system","content":[{"text":"S","type":"text"}]},
      {"role":"developer","content":[{"text":"D","type":"text"}]},
      {"role":"user","name":"bob","content":[{"text":"U1","type":"text"},
          {"image_url":{"url":"data:x"},"type":"image_url"},{"text":"U2","type":"text"}]}]})");
}

TEST(ResponsesToChat, FunctionCallMergesIntoThePreviousAssistantMessage) {
  const auto chat = chat_of(R"({"input":[
      {"role":"user","content":"Q"},
      {"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[
          {"type":"output_text","text":"Let me look.","annotations":[]},
          {"type":"refusal","refusal":"Not that."}]},
      {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}","id":"fc_1"},
      {"type":"function_call","call_id":"c2","name":"g","arguments":"{}"}]})");
  expect_json(chat, R"({"messages":[
      {"role":"user","content":[{"text":"Q","type":"text"}]},
      {"role":"assistant","id":"msg_1","content":[{"text":"Let me look.","type":"text"},
          {"refusal":"Not that.","type":"refusal"}],
       "tool_calls":[
          {"function":{"arguments":"{\"a\":1}","name":"f"},"id":"c1","type":"function"},
          {"function":{"arguments":"{}","name":"g"},"id":"c2","type":"function"}]}]})");
}

TEST(ResponsesToChat, AssistantMessagesAfterAnAssistantAppendTheirParts) {
  const auto chat = chat_of(R"({"input":[
      {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
      {"type":"message","role":"assistant","content":"Done."},
      {"type":"message","role":"assistant","content":[{"type":"input_text","text":"Also."}]}]})");
  expect_json(chat, R"({"messages":[{"role":"assistant",
      "tool_calls":[{"function":{"arguments":"{}","name":"f"},"id":"c1","type":"function"}],
      "content":[{"text":"Done.","type":"text"},{"text":"Also.","type":"text"}]}]})");
}

TEST(ResponsesToChat, AssistantMessageWithoutContentHasNoParts) {
  expect_json(chat_of(R"({"input":[{"type":"message","role":"assistant"}]})"),
              R"({"messages":[{"role":"assistant","content":[]}]})");
}

TEST(ResponsesToChat, FunctionCallOutputsBecomeToolMessages) {
  const auto chat = chat_of(R"({"input":[
      {"type":"function_call_output","call_id":"c1","output":"42"},
      {"type":"function_call_output","call_id":"c2","output":[
          {"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]})");
  expect_json(chat, R"({"messages":[
      {"content":"42","role":"tool","tool_call_id":"c1"},
      {"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"role":"tool",
       "tool_call_id":"c2"}]})");
}

TEST(ResponsesToChat, ReasoningStartsAnAssistantMessageOrJoinsThePreviousOne) {
  const auto alone = chat_of(R"({"input":[{"role":"user","content":"Q"},
      {"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"Hmm."}]}]})");
  expect_json(alone, R"({"messages":[{"role":"user","content":[{"text":"Q","type":"text"}]},
      {"role":"assistant","content":[],"reasoning_content":"Hmm."}]})");

  const auto merged = chat_of(R"({"input":[
      {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
      {"type":"reasoning","summary":[],"content":"Think."}]})");
  expect_json(merged, R"({"messages":[{"role":"assistant","reasoning_content":"Think.",
      "tool_calls":[{"function":{"arguments":"{}","name":"f"},"id":"c1","type":"function"}]}]})");
}

TEST(ResponsesToChat, FunctionToolsKeptWithStrictDefaultedAndOthersDropped) {
  const auto chat = chat_of(R"({"input":"Hi","tools":[
      {"type":"function","name":"f","parameters":{"type":"object"}},
      {"type":"web_search"},
      {"type":"function","name":"g","strict":false},
      "not a tool"]})");
  expect_json(chat, R"({"messages":[{"role":"user","content":"Hi"}],"tools":[
      {"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":true}},
      {"type":"function","function":{"name":"g","strict":false}}]})");
}

TEST(ResponsesToChat, ToolsRemovedWhenNoneIsAFunction) {
  expect_json(chat_of(R"({"input":"Hi","tools":[{"type":"web_search"}]})"),
              R"({"messages":[{"role":"user","content":"Hi"}]})");
  expect_json(chat_of(R"({"input":"Hi","tools":[]})"),
              R"({"messages":[{"role":"user","content":"Hi"}]})");
}

TEST(ResponsesToChat, MaxOutputTokensAndReasoningEffortRenamed) {
  expect_json(chat_of(R"({"input":"Hi","max_output_tokens":64,
                          "reasoning":{"effort":"low","summary":"auto"}})"),
              R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":64,
                  "reasoning_effort":"low"})");
  expect_json(chat_of(R"({"input":"Hi","reasoning":{"summary":"auto"}})"),
              R"({"messages":[{"role":"user","content":"Hi"}]})");
}

TEST(ResponsesToChat, ConvertedMembersReplaceClientOnes) {
  expect_json(chat_of(R"({"input":"Hi","messages":[1],"max_tokens":1,"max_output_tokens":9})"),
              R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":9})");
}

TEST(ResponsesToChat, RefusesBodiesAsLlamaServerWordsIt) {
  EXPECT_EQ(refusal_of(R"([1])"), "request body: expected a JSON object");
  EXPECT_EQ(refusal_of(R"({"model":"m"})"), "'input' is required");
  EXPECT_EQ(refusal_of(R"({"input":"Hi","previous_response_id":"resp_1"})"),
            "llama.cpp does not support 'previous_response_id'.");
  EXPECT_EQ(refusal_of(R"({"input":"Hi","previous_response_id":""})"), "");
  EXPECT_EQ(refusal_of(R"({"input":"Hi","previous_response_id":null})"), "");
  EXPECT_EQ(refusal_of(R"({"input":7})"), "'input' must be a string or array of objects");
  EXPECT_EQ(refusal_of(R"({"input":null})"), "'input' must be a string or array of objects");
  EXPECT_EQ(refusal_of(R"({"input":"Hi","tools":{}})"), "'tools' must be an array of objects");
}

TEST(ResponsesToChat, RefusesItemsAsLlamaServerWordsIt) {
  const auto item = [](const std::string& json) {
    return refusal_of(R"({"input":[)" + json + "]}");
  };
  EXPECT_EQ(item(R"("text")"), "Cannot determine type of 'item'");
  EXPECT_EQ(item(R"({"role":"tool","content":"x"})"), "Cannot determine type of 'item'");
  EXPECT_EQ(item(R"({"role":"assistant","content":"x"})"), "Cannot determine type of 'item'");
  EXPECT_EQ(item(R"({"type":"function_call","call_id":"c","name":"f"})"),
            "Cannot determine type of 'item'");
  EXPECT_EQ(item(R"({"role":"user","content":[{"type":"input_text"}]})"),
            "'Input text' requires 'text'");
  EXPECT_EQ(item(R"({"role":"user","content":[{"type":"input_image"}]})"),
            "'image_url' is required");
  EXPECT_EQ(item(R"({"role":"user","content":[{"type":"input_file","file_id":"f"}]})"),
            "'input_file' is not supported by llamacpp at this moment");
  EXPECT_EQ(item(R"({"role":"user","content":[{"type":"output_text","text":"x"}]})"),
            "'type' must be one of 'input_text', 'input_image', or 'input_file'");
  EXPECT_EQ(item(R"({"type":"message","role":"assistant","content":[{"type":"output_text"}]})"),
            "'Output text' requires 'text'");
  EXPECT_EQ(item(R"({"type":"message","role":"assistant","content":[{"type":"refusal"}]})"),
            "'Refusal' requires 'refusal'");
  EXPECT_EQ(item(R"({"type":"message","role":"assistant","content":[{"type":"input_image"}]})"),
            "'type' must be one of 'output_text' or 'refusal'");
  EXPECT_EQ(item(R"({"type":"function_call_output","call_id":"c","output":[{"text":"x"}]})"),
            "Output of tool call should be 'Input text'");
  EXPECT_EQ(item(R"({"type":"reasoning","summary":[]})"), "item['content'] is not an array");
  EXPECT_EQ(item(R"({"type":"reasoning","summary":[],"content":[]})"), "item['content'] is empty");
  EXPECT_EQ(item(R"({"type":"reasoning","summary":[],"content":[{"text":1}]})"),
            "item['content']['text'] is not a string");
}

TEST(ResponsesUsage, ReadsInputAndCachedTokens) {
  uint32_t input = 0, cached = 0;
  EXPECT_TRUE(responses_usage(parsed(R"({"object":"response","usage":{"input_tokens":120,
      "output_tokens":5,"total_tokens":125,"input_tokens_details":{"cached_tokens":100}}})"),
                              &input, &cached));
  EXPECT_EQ(input, 120u);
  EXPECT_EQ(cached, 100u);
  EXPECT_TRUE(responses_usage(parsed(R"({"usage":{"input_tokens":7}})"), &input, &cached));
  EXPECT_EQ(input, 7u);
  EXPECT_EQ(cached, 0u);
}

TEST(ResponsesUsage, FalseWithoutUsageOrInputTokens) {
  uint32_t input = 0, cached = 0;
  EXPECT_FALSE(responses_usage(parsed(R"({"object":"response"})"), &input, &cached));
  EXPECT_FALSE(responses_usage(parsed(R"({"usage":{"output_tokens":3}})"), &input, &cached));
  EXPECT_FALSE(responses_usage(parsed(R"({"usage":null})"), &input, &cached));
  EXPECT_FALSE(responses_usage(parsed(R"([])"), &input, &cached));
}

TEST(SetResponsesCachedTokens, RewritesOrCreatesTheDetails) {
  auto response =
      parsed(R"({"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0}}})");
  set_responses_cached_tokens(response, 8, response.GetAllocator());
  expect_json(response,
              R"({"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":8}}})");

  auto bare = parsed(R"({"usage":{"input_tokens":9}})");
  set_responses_cached_tokens(bare, 4, bare.GetAllocator());
  expect_json(bare, R"({"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4}}})");
  uint32_t input = 0, cached = 0;
  EXPECT_TRUE(responses_usage(bare, &input, &cached));
  EXPECT_EQ(cached, 4u);
}

TEST(SetResponsesCachedTokens, LeavesAResponseWithoutUsageAlone) {
  auto response = parsed(R"({"id":"r","output":[]})");
  set_responses_cached_tokens(response, 8, response.GetAllocator());
  expect_json(response, R"({"id":"r","output":[]})");
}

// llama-server's own event sequence for a reasoning item then a message (recorded shape:
// no output_index, content_index or sequence_number, no reasoning content part).
TEST(ResponsesStream, CompletesLlamaServerEventsForTheSdkAccumulators) {
  const char* events[] = {
      R"({"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress"}})",
      R"({"type":"response.in_progress","response":{"id":"resp_1","object":"response","status":"in_progress"}})",
      R"({"type":"response.output_item.added","item":{"id":"rs_1","summary":[],"type":"reasoning","content":[],"encrypted_content":"","status":"in_progress"}})",
      R"({"type":"response.reasoning_text.delta","delta":"hm","item_id":"rs_1"})",
      R"({"type":"response.output_item.added","item":{"content":[],"id":"msg_1","role":"assistant","status":"in_progress","type":"message"}})",
      R"({"type":"response.content_part.added","item_id":"msg_1","part":{"type":"output_text","text":""}})",
      R"({"type":"response.output_text.delta","item_id":"msg_1","delta":"Hi"})",
      R"({"type":"response.output_text.done","item_id":"msg_1","text":"Hi"})",
      R"({"type":"response.output_item.done","item":{"type":"message","id":"msg_1","content":[]}})",
      R"({"type":"response.completed","response":{"id":"resp_1","output":[]}})"};
  ResponsesStream stream;
  std::vector<rapidjson::Document> out;
  std::string reasoning_part;
  for (const char* text : events) {
    out.push_back(parsed(text));
    const std::string after = stream.complete(out.back());
    if (!after.empty()) reasoning_part = after;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t expected = i <= 2 ? i : i + 1;  // the inserted part took number 3
    EXPECT_EQ(out[i]["sequence_number"].GetUint64(), expected) << serialized(out[i]);
  }
  EXPECT_TRUE(out[0]["response"]["output"].IsArray());
  EXPECT_TRUE(out[1]["response"]["output"].IsArray());
  EXPECT_FALSE(out[9]["response"].HasMember("sequence_number"));
  EXPECT_EQ(out[2]["output_index"].GetUint64(), 0u);
  EXPECT_EQ(out[3]["output_index"].GetUint64(), 0u);
  EXPECT_EQ(out[3]["content_index"].GetUint64(), 0u);
  for (size_t i = 4; i <= 8; ++i)
    EXPECT_EQ(out[i]["output_index"].GetUint64(), 1u) << serialized(out[i]);
  for (size_t i : {5, 6, 7}) EXPECT_EQ(out[i]["content_index"].GetUint64(), 0u);
  EXPECT_FALSE(out[8].HasMember("content_index"));
  EXPECT_FALSE(out[9].HasMember("output_index"));
  ASSERT_EQ(reasoning_part.rfind("event: response.content_part.added\ndata: ", 0), 0u)
      << reasoning_part;
  auto part = parsed(reasoning_part.substr(reasoning_part.find('{')));
  expect_json(part, R"({"type":"response.content_part.added","item_id":"rs_1","output_index":0,)"
                    R"("content_index":0,"part":{"type":"reasoning_text","text":""},)"
                    R"("sequence_number":3})");
}

TEST(ResponsesStream, KeepsIndicesAnUpstreamAlreadyWrote) {
  ResponsesStream stream;
  auto event = parsed(
      R"({"type":"response.output_text.delta","item_id":"m","output_index":4,"content_index":2,)"
      R"("sequence_number":17,"delta":"x"})");
  EXPECT_EQ(stream.complete(event), "");
  expect_json(event, R"({"type":"response.output_text.delta","item_id":"m","output_index":4,)"
                     R"("content_index":2,"sequence_number":17,"delta":"x"})");
}

}  // namespace
}  // namespace kvpark::proxy
