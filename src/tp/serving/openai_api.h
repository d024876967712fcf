#pragma once
// The OpenAI-compatible wire format of `tp serve`: request bodies of
// /v1/completions and /v1/chat/completions parsed and validated into plain
// structs, and the JSON of responses, stream chunks and errors. Pure: no HTTP,
// no model, so every rule is unit-tested.
//
// Field rules follow OpenAI's API reference and vLLM's server where OpenAI is
// silent: `prompt` is a string or a list of token ids (one prompt), `stop` a
// string or a list of strings, `n` must be 1, `top_k` (vLLM's extension; 0 or
// -1: off) and `return_token_ids` (ours: each choice also carries its token ids)
// are accepted, and unknown fields are ignored.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tp/chat/chat_template.h"
#include "tp/core/error.h"

namespace tp::serving {

// A request the server refuses: HTTP status plus OpenAI's error object
// {"error": {"message", "type", "param", "code"}}.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string type = "invalid_request_error",
           std::string code = "")
      : Error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type, param, code;
};

// A chat turn as the chat template takes it.
using ChatMessage = chat::Message;

enum class Endpoint { Completions, ChatCompletions };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;  // empty: the served model
  // /v1/completions: text, or token ids when prompt_is_ids.
  std::string prompt_text;
  std::vector<int64_t> prompt_ids;
  bool prompt_is_ids = false;
  std::vector<ChatMessage> messages;  // /v1/chat/completions
  std::optional<int64_t> max_tokens;  // unset: the endpoint's default (see Server)
  double temperature = 1.0;           // OpenAI's default; 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool return_token_ids = false;
};

// Parses and checks a request body; ApiError(400) names the bad field.
CompletionRequest parse_request(const std::string& body, Endpoint endpoint);

// The body of an error response.
std::string error_body(const ApiError& e);

enum class FinishReason { Stop, Length };
const char* finish_reason_name(FinishReason r);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// Identity of one response: "cmpl-..." / "chatcmpl-..." id, creation time, model name.
struct ResponseHeader {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// A whole (non-streamed) response: object "text_completion" or "chat.completion".
nlohmann::ordered_json completion_response(Endpoint endpoint, const ResponseHeader& h, const std::string& text,
                                           FinishReason finish, const Usage& usage,
                                           const std::vector<int64_t>* token_ids);

// One server-sent event of a stream: "data: {chunk}\n\n". The chat stream opens
// with a chunk whose delta is {"role": "assistant"} (first = true); the last
// chunk carries the finish reason and an empty delta/text.
std::string stream_chunk(Endpoint endpoint, const ResponseHeader& h, const std::string& text,
                         std::optional<FinishReason> finish, const std::vector<int64_t>* token_ids, bool first = false);
// stream_options.include_usage: the chunk after the last choice, with empty choices.
std::string usage_chunk(Endpoint endpoint, const ResponseHeader& h, const Usage& usage);
inline constexpr const char* kStreamDone = "data: [DONE]\n\n";

// GET /v1/models
nlohmann::ordered_json models_response(const std::string& model, int64_t created, int64_t max_model_len);

}  // namespace tp::serving
