#pragma once
// A model's chat template: renders a conversation into the prompt text the
// model was trained on, as Transformers' apply_chat_template(messages,
// tokenize=False, add_generation_prompt=...) does, byte for byte as
// @huggingface/jinja (Transformers.js) renders it.
//
// Template variables: messages, add_generation_prompt, the special tokens of
// tokenizer_config.json (bos_token, eos_token, unk_token, sep_token,
// pad_token, cls_token, mask_token; plain strings or AddedToken dicts), the
// globals raise_exception, strftime_now, namespace, range, and any extras.
// The Jinja subset is that of the Llama 2/3, Mistral, Qwen3 and DeepSeek-V3
// templates (see parser.h and builtins.h); anything else is a tp::Error naming
// the template, line and column.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace tp::chat {

struct Message {
  std::string role;
  std::string content;
};

struct CompiledTemplate;

class ChatTemplate {
 public:
  // tokenizer_config.json's chat_template in `dir` (a chat_template.jinja next
  // to it wins, as in Transformers; of a list of named templates, "default").
  // A tp::Error naming the folder when there is none.
  static ChatTemplate from_model_dir(const std::filesystem::path& dir);
  // `source` is the Jinja text, `name` labels errors, `context` holds
  // bos_token/eos_token/... strings (and any other variables).
  static ChatTemplate from_string(std::string source, std::string name, nlohmann::json context = {});

  std::string apply(const std::vector<Message>& messages, bool add_generation_prompt) const;
  // `messages`: an array of {role, content, ...} objects; `extra` (an object,
  // e.g. {"enable_thinking": false}) is merged over the other variables.
  std::string apply(const nlohmann::json& messages, bool add_generation_prompt,
                    const nlohmann::json& extra = nlohmann::json::object()) const;

  const std::string& name() const;
  const std::string& source() const;

 private:
  explicit ChatTemplate(std::shared_ptr<const CompiledTemplate> t) : t_(std::move(t)) {}
  std::shared_ptr<const CompiledTemplate> t_;
};

// The special tokens of a tokenizer_config.json object as template variables
// ({"bos_token": "<s>", ...}); AddedToken dicts give their "content", null
// and empty ones are left out (as Transformers.js does).
nlohmann::json special_token_variables(const nlohmann::json& tokenizer_config);

}  // namespace tp::chat
