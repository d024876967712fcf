// The OpenAI wire format: what parse_request accepts, the 4xx it gives for the
// rest (naming the field), and the JSON shapes of responses and stream chunks.
#include <gtest/gtest.h>

#include "tp/serving/openai_api.h"

using namespace tp::serving;
using json = nlohmann::json;

namespace {

// The ApiError a body gives; fails the test when it parses.
ApiError rejected(const std::string& body, Endpoint e = Endpoint::Completions) {
  try {
    parse_request(body, e);
  } catch (const ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

}  // namespace

TEST(OpenAiApi, ParsesACompletionRequest) {
  CompletionRequest r = parse_request(
      R"({"model": "m", "prompt": "Hello", "max_tokens": 5, "temperature": 0, "top_p": 0.9, "stop": "\n",
          "seed": 3, "stream": true, "stream_options": {"include_usage": true}, "n": 1, "user": "ignored"})",
      Endpoint::Completions);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "Hello");
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.temperature, 0);
  EXPECT_DOUBLE_EQ(r.top_p, 0.9);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.seed, 3u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);

  CompletionRequest ids = parse_request(R"({"prompt": [1, 2, 3], "stop": ["a", "bc"], "top_k": -1})",
                                        Endpoint::Completions);
  EXPECT_TRUE(ids.prompt_is_ids);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ids.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(ids.top_k, 0);
  EXPECT_FALSE(ids.max_tokens.has_value());
  EXPECT_EQ(ids.temperature, 1.0);  // OpenAI's default
}

TEST(OpenAiApi, ParsesChatMessages) {
  CompletionRequest r = parse_request(
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}],
          "max_completion_tokens": 7})",
      Endpoint::ChatCompletions);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi!");
  EXPECT_EQ(r.max_tokens, 7);
}

TEST(OpenAiApi, AcceptsEveryOpenAiRoleAndTheNeutralFieldValues) {
  CompletionRequest r = parse_request(
      R"({"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "2+2?", "name": "u"},
                       {"role": "assistant", "content": ""}, {"role": "tool", "content": "4", "tool_call_id": "c1"}],
          "tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "logprobs": false})",
      Endpoint::ChatCompletions);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "developer");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.messages[3].role, "tool");
  EXPECT_EQ(r.messages[3].content, "4");
  ApiError e = rejected(R"({"messages": [{"role": "wizard", "content": "x"}]})", Endpoint::ChatCompletions);
  EXPECT_EQ(e.code, "invalid_value");
  e = rejected(R"({"messages": [{"role": "user"}]})", Endpoint::ChatCompletions);
  EXPECT_EQ(e.code, "missing_required_parameter");
}

TEST(OpenAiApi, BadRequestsNameTheField) {
  struct Case {
    std::string body, param, says;
    Endpoint endpoint = Endpoint::Completions;
  };
  const std::vector<Case> cases = {
      {"{not json", "", "not valid JSON"},
      {"[1, 2]", "", "must be a JSON object"},
      {R"({"max_tokens": 3})", "prompt", "'prompt' is required"},
      {R"({"prompt": 5})", "prompt", "a string or a list of token ids"},
      {R"({"prompt": ""})", "prompt", "must not be empty"},
      {R"({"prompt": [1, -2]})", "prompt", "token ids"},
      {R"({"prompt": ["a", "b"]})", "prompt", "batched prompts"},
      {R"({"prompt": "x", "max_tokens": "9"})", "max_tokens", "must be an integer, got a string"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "at least 1"},
      {R"({"prompt": "x", "max_tokens": 99999999999999999999})", "max_tokens", "integer"},
      {R"({"prompt": "x", "temperature": 3})", "temperature", "[0, 2]"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature", "must be a number"},
      {R"({"prompt": "x", "top_p": 0})", "top_p", "(0, 1]"},
      {R"({"prompt": "x", "n": 2})", "n", "n must be 1"},
      {R"({"prompt": "x", "stop": 4})", "stop", "a string or a list of strings"},
      {R"({"prompt": "x", "stop": [""]})", "stop", "must not be empty"},
      {R"({"prompt": "x", "stream": "yes"})", "stream", "must be a boolean"},
      {R"({"prompt": "x", "seed": 1.5})", "seed", "must be an integer"},
      {R"({"prompt": "x", "model": 7})", "model", "must be a string"},
      {R"({"prompt": "x", "logprobs": 2})", "logprobs", "not supported"},
      {R"({"messages": []})", "messages", "must not be empty", Endpoint::ChatCompletions},
      {R"({"prompt": "x"})", "messages", "'messages' is required", Endpoint::ChatCompletions},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role", "must be a string", Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "user", "content": 3}]})", "messages[0].content", "string or a list",
       Endpoint::ChatCompletions},
      // OpenAI's request rules: its roles only, content where it is required, text parts only.
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role", "'wizard'. Supported values",
       Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]})", "messages[1].content",
       "Missing required parameter: 'messages[1].content'", Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "assistant", "content": null}]})", "messages[0].content", "Missing required",
       Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "tool", "content": "42"}]})", "messages[0].tool_call_id", "tool_call_id",
       Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "assistant", "content": "", "function_call": {"name": "f"}}]})",
       "messages[0].function_call", "no tool calling", Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}]})",
       "messages[0].tool_calls", "no tool calling", Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]})",
       "messages[0].content[0]", "is a 'image_url' part", Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content[0]",
       "'messages[0].content[0].text' must be a string", Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools",
       "no tool calling", Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"})", "tool_choice", "\"none\"",
       Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
       "response_format", "JSON modes", Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})", "logprobs", "not supported",
       Endpoint::ChatCompletions},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs", "not supported",
       Endpoint::ChatCompletions},
      {R"({"prompt": "x", "response_format": {"type": "json_schema"}})", "response_format", "JSON modes"},
  };
  for (const Case& c : cases) {
    ApiError e = rejected(c.body, c.endpoint);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.body << " -> " << e.what();
    json err = json::parse(error_body(e));
    EXPECT_EQ(err["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(err["error"].contains("message") && err["error"].contains("param") && err["error"].contains("code"));
  }
  // Invalid UTF-8 quoted in the parse error still gives valid JSON.
  EXPECT_NO_THROW(json::parse(error_body(rejected("{\"prompt\": \"\xff\xfe"))));
}

TEST(OpenAiApi, ResponseShapes) {
  ResponseHeader h{"cmpl-1", 1700000000, "tiny"};
  std::vector<int64_t> ids{4, 5};
  json c = completion_response(Endpoint::Completions, h, "hi", FinishReason::Length, {3, 2}, &ids);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "hi");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["choices"][0]["token_ids"], json({4, 5}));
  EXPECT_EQ(c["usage"]["total_tokens"], 5);
  json chat = completion_response(Endpoint::ChatCompletions, h, "yo", FinishReason::Stop, {3, 1}, nullptr);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"], json({{"role", "assistant"}, {"content", "yo"}}));
  EXPECT_FALSE(chat["choices"][0].contains("token_ids"));

  auto event = [](const std::string& s) {
    EXPECT_EQ(s.rfind("data: ", 0), 0u);
    EXPECT_EQ(s.substr(s.size() - 2), "\n\n");
    return json::parse(s.substr(6));
  };
  json first = event(stream_chunk(Endpoint::ChatCompletions, h, "", std::nullopt, nullptr, true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  json mid = event(stream_chunk(Endpoint::ChatCompletions, h, "a", std::nullopt, nullptr));
  EXPECT_EQ(mid["choices"][0]["delta"], json({{"content", "a"}}));
  json last = event(stream_chunk(Endpoint::ChatCompletions, h, "", FinishReason::Stop, nullptr));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  json text = event(stream_chunk(Endpoint::Completions, h, "b", std::nullopt, nullptr));
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["text"], "b");
  json usage = event(usage_chunk(Endpoint::Completions, h, {2, 3}));
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  json models = models_response("tiny", 1, 64);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["object"], "list");
}
