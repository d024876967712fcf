#include "tp/serving/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

namespace tp::serving {

using json = nlohmann::json;

namespace {

// A 400 naming the field; `code` as OpenAI's (invalid_value, missing_required_parameter) where it gives one.
[[noreturn]] void bad(const std::string& param, const std::string& message, const std::string& code = "") {
  throw ApiError(400, message, param, "invalid_request_error", code);
}

const char* type_name(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// The field when present and not null.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& body, const char* name, double fallback, double lo, double hi) {
  const json* v = field(body, name);
  if (v == nullptr) return fallback;
  if (!v->is_number()) bad(name, fmt::format("'{}' must be a number, got {}", name, type_name(*v)));
  double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x));
  return x;
}

std::optional<int64_t> integer(const json& body, const char* name) {
  const json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!(v->is_number_integer() || v->is_number_unsigned()))
    bad(name, fmt::format("'{}' must be an integer, got {}", name, type_name(*v)));
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad(name, fmt::format("'{}' is too large: {}", name, v->dump()));
  return v->get<int64_t>();
}

bool boolean(const json& body, const char* name) {
  const json* v = field(body, name);
  if (v == nullptr) return false;
  if (!v->is_boolean()) bad(name, fmt::format("'{}' must be a boolean, got {}", name, type_name(*v)));
  return v->get<bool>();
}

std::vector<std::string> stop_strings(const json& body) {
  const json* v = field(body, "stop");
  if (v == nullptr) return {};
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) bad("stop", fmt::format("'stop' must be a string or a list of strings, got an item that is {}", type_name(s)));
      stops.push_back(s.get<std::string>());
    }
  } else {
    bad("stop", fmt::format("'stop' must be a string or a list of strings, got {}", type_name(*v)));
  }
  for (const std::string& s : stops)
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
  return stops;
}

void read_prompt(const json& body, CompletionRequest& r) {
  const json* p = field(body, "prompt");
  if (p == nullptr) bad("prompt", "'prompt' is required (a string or a list of token ids)");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    if (r.prompt_text.empty()) bad("prompt", "'prompt' must not be empty");
    return;
  }
  if (!p->is_array())
    bad("prompt", fmt::format("'prompt' must be a string or a list of token ids, got {}", type_name(*p)));
  if (p->empty()) bad("prompt", "'prompt' must not be empty");
  if (p->at(0).is_string() || p->at(0).is_array())
    bad("prompt", "batched prompts (a list of prompts) are not supported: send one request per prompt");
  for (const json& id : *p) {
    if (!(id.is_number_integer() || id.is_number_unsigned()) || id.get<int64_t>() < 0)
      bad("prompt", fmt::format("'prompt' as a list must hold token ids (integers >= 0), got {}", id.dump()));
    r.prompt_ids.push_back(id.get<int64_t>());
  }
  r.prompt_is_ids = true;
}

// The roles of OpenAI's chat messages (the deprecated "function" role aside). Each
// needs its content: OpenAI exempts only an assistant turn with tool calls, refused here.
constexpr const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};

// A message's content: a string, or text parts (a text model reads no other part type).
std::string message_content(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array())
    bad(where + ".content",
        fmt::format("'{}.content' must be a string or a list of text parts, got {}", where, type_name(c)));
  std::string out;
  for (size_t j = 0; j < c.size(); ++j) {
    const json& part = c[j];
    const std::string at = fmt::format("{}.content[{}]", where, j);
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    if (type == nullptr || !type->is_string())
      bad(at, fmt::format("'{}' must be an object with a 'type' (\"text\")", at));
    if (*type != "text")
      bad(at, fmt::format("'{}' is a '{}' part: this model reads text only (parts of type 'text')", at,
                          type->get<std::string>()));
    const json* text = field(part, "text");
    if (text == nullptr || !text->is_string()) bad(at, fmt::format("'{}.text' must be a string", at));
    out += text->get<std::string>();
  }
  return out;
}

void read_messages(const json& body, CompletionRequest& r) {
  const json* m = field(body, "messages");
  if (m == nullptr) bad("messages", "'messages' is required (a list of {\"role\", \"content\"} objects)");
  if (!m->is_array()) bad("messages", fmt::format("'messages' must be a list, got {}", type_name(*m)));
  if (m->empty()) bad("messages", "'messages' must not be empty");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = m->at(i);
    const std::string where = fmt::format("messages[{}]", i);
    if (!msg.is_object()) bad(where, fmt::format("'{}' must be an object, got {}", where, type_name(msg)));
    const json* role = field(msg, "role");
    if (role == nullptr || !role->is_string()) bad(where + ".role", fmt::format("'{}.role' must be a string", where));
    const std::string name = role->get<std::string>();
    if (std::find(std::begin(kRoles), std::end(kRoles), name) == std::end(kRoles))
      bad(where + ".role",
          fmt::format("Invalid value for '{}.role': '{}'. Supported values are: 'system', 'developer', 'user', "
                      "'assistant' and 'tool'",
                      where, name),
          "invalid_value");
    for (const char* calls : {"tool_calls", "function_call"})
      if (field(msg, calls) != nullptr)
        bad(fmt::format("{}.{}", where, calls),
            fmt::format("'{}.{}' is not supported: tp serve has no tool calling", where, calls));
    if (name == "tool") {
      const json* id = field(msg, "tool_call_id");
      if (id == nullptr || !id->is_string())
        bad(where + ".tool_call_id", fmt::format("Missing required parameter: '{}.tool_call_id' (a string)", where),
            "missing_required_parameter");
    }
    const json* c = field(msg, "content");
    if (c == nullptr)
      bad(where + ".content",
          fmt::format("Missing required parameter: '{}.content' (a {} message needs its text)", where, name),
          "missing_required_parameter");
    r.messages.push_back(ChatMessage{name, message_content(*c, where)});
  }
}

// Request fields of OpenAI's API that tp serve does not implement: refused, naming them,
// rather than ignored (a client relying on one would get something it did not ask for).
void refuse_unsupported(const json& body, Endpoint endpoint) {
  if (const json* t = field(body, "tools"); t != nullptr && !(t->is_array() && t->empty()))
    bad("tools", "'tools' is not supported: tp serve has no tool calling");
  if (const json* t = field(body, "functions"); t != nullptr)
    bad("functions", "'functions' is not supported: tp serve has no tool calling");
  if (const json* t = field(body, "tool_choice"); t != nullptr && *t != "none")
    bad("tool_choice", "'tool_choice' can only be \"none\": tp serve has no tool calling");
  if (const json* f = field(body, "response_format")) {
    const json* type = f->is_object() ? field(*f, "type") : nullptr;
    if (type == nullptr || *type != "text")
      bad("response_format",
          "'response_format' can only be {\"type\": \"text\"}: JSON modes and schemas are not supported");
  }
  if (field(body, "top_logprobs") != nullptr) bad("top_logprobs", "'top_logprobs' is not supported");
  if (endpoint == Endpoint::ChatCompletions && field(body, "audio") != nullptr)
    bad("audio", "'audio' is not supported: this model reads and writes text");
}

}  // namespace

CompletionRequest parse_request(const std::string& body_text, Endpoint endpoint) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!body.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", type_name(body)));

  CompletionRequest r;
  r.endpoint = endpoint;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) bad("model", fmt::format("'model' must be a string, got {}", type_name(*m)));
    r.model = m->get<std::string>();
  }
  if (endpoint == Endpoint::Completions) {
    read_prompt(body, r);
    if (boolean(body, "echo")) bad("echo", "'echo' is not supported");
    if (const json* b = field(body, "best_of"); b != nullptr && *b != 1) bad("best_of", "'best_of' must be 1");
  } else {
    read_messages(body, r);
  }
  refuse_unsupported(body, endpoint);
  // max_completion_tokens is the chat API's newer name for max_tokens.
  r.max_tokens = integer(body, "max_tokens");
  if (!r.max_tokens && endpoint == Endpoint::ChatCompletions) r.max_tokens = integer(body, "max_completion_tokens");
  if (r.max_tokens && *r.max_tokens < 1)
    bad("max_tokens", fmt::format("'max_tokens' must be at least 1, got {}", *r.max_tokens));
  r.temperature = number(body, "temperature", 1.0, 0, 2);
  r.top_p = number(body, "top_p", 1.0, 0, 1);
  if (r.top_p == 0) bad("top_p", "'top_p' must be in (0, 1], got 0");
  r.top_k = integer(body, "top_k").value_or(0);
  if (r.top_k < -1) bad("top_k", fmt::format("'top_k' must be -1 or 0 (off) or a positive count, got {}", r.top_k));
  if (r.top_k == -1) r.top_k = 0;
  if (auto n = integer(body, "n"); n && *n != 1) bad("n", "n must be 1");
  if (const json* lp = field(body, "logprobs"); lp != nullptr && *lp != false) bad("logprobs", "'logprobs' is not supported");
  r.stop = stop_strings(body);
  if (const json* s = field(body, "seed")) {
    if (!(s->is_number_integer() || s->is_number_unsigned()))
      bad("seed", fmt::format("'seed' must be an integer, got {}", type_name(*s)));
    r.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  r.stream = boolean(body, "stream");
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", fmt::format("'stream_options' must be an object, got {}", type_name(*so)));
    r.include_usage = boolean(*so, "include_usage");
  }
  r.return_token_ids = boolean(body, "return_token_ids");
  return r;
}

std::string error_body(const ApiError& e) {
  nlohmann::ordered_json j;
  j["error"]["message"] = e.what();
  j["error"]["type"] = e.type;
  j["error"]["param"] = e.param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(e.param);
  j["error"]["code"] = e.code.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(e.code);
  // A parse error quotes the body, which may hold invalid UTF-8.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

const char* finish_reason_name(FinishReason r) { return r == FinishReason::Stop ? "stop" : "length"; }

namespace {

nlohmann::ordered_json head(const ResponseHeader& h, const char* object) {
  nlohmann::ordered_json j;
  j["id"] = h.id;
  j["object"] = object;
  j["created"] = h.created;
  j["model"] = h.model;
  return j;
}

nlohmann::ordered_json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

nlohmann::ordered_json completion_response(Endpoint endpoint, const ResponseHeader& h, const std::string& text,
                                           FinishReason finish, const Usage& usage,
                                           const std::vector<int64_t>* token_ids) {
  const bool chat = endpoint == Endpoint::ChatCompletions;
  nlohmann::ordered_json j = head(h, chat ? "chat.completion" : "text_completion");
  nlohmann::ordered_json choice;
  choice["index"] = 0;
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish_reason_name(finish);
  if (token_ids) choice["token_ids"] = *token_ids;
  j["choices"] = nlohmann::ordered_json::array({choice});
  j["usage"] = usage_json(usage);
  return j;
}

std::string stream_chunk(Endpoint endpoint, const ResponseHeader& h, const std::string& text,
                         std::optional<FinishReason> finish, const std::vector<int64_t>* token_ids, bool first) {
  const bool chat = endpoint == Endpoint::ChatCompletions;
  nlohmann::ordered_json j = head(h, chat ? "chat.completion.chunk" : "text_completion");
  nlohmann::ordered_json choice;
  choice["index"] = 0;
  if (chat) {
    nlohmann::ordered_json delta = nlohmann::ordered_json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (!first && !finish)) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish ? nlohmann::ordered_json(finish_reason_name(*finish)) : nlohmann::ordered_json();
  if (token_ids) choice["token_ids"] = *token_ids;
  j["choices"] = nlohmann::ordered_json::array({choice});
  return "data: " + j.dump() + "\n\n";
}

std::string usage_chunk(Endpoint endpoint, const ResponseHeader& h, const Usage& usage) {
  nlohmann::ordered_json j = head(h, endpoint == Endpoint::ChatCompletions ? "chat.completion.chunk" : "text_completion");
  j["choices"] = nlohmann::ordered_json::array();
  j["usage"] = usage_json(usage);
  return "data: " + j.dump() + "\n\n";
}

nlohmann::ordered_json models_response(const std::string& model, int64_t created, int64_t max_model_len) {
  nlohmann::ordered_json m;
  m["id"] = model;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "tp";
  m["max_model_len"] = max_model_len;
  return {{"object", "list"}, {"data", nlohmann::ordered_json::array({m})}};
}

}  // namespace tp::serving
