#include "tp/chat/chat_template.h"

#include <fstream>
#include <sstream>

#include "tp/chat/interpreter.h"
#include "tp/chat/parser.h"
#include "tp/core/error.h"

namespace tp::chat {

struct CompiledTemplate {
  std::string source, name;
  nlohmann::json context;
  Block program;
};

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TP_CHECK(in, "cannot read {}", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// chat_template as a string or as [{"name": ..., "template": ...}, ...] (or a
// {name: template} object): the "default" one, as Transformers picks it.
std::string pick_template(const nlohmann::json& value, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  std::vector<std::string> names;
  auto consider = [&](const std::string& name, const nlohmann::json& text) -> std::optional<std::string> {
    TP_CHECK(text.is_string(), "{}: chat template '{}' is not a string", where, name);
    names.push_back(name);
    if (name == "default") return text.get<std::string>();
    return std::nullopt;
  };
  if (value.is_array()) {
    for (const auto& entry : value) {
      TP_CHECK(entry.is_object() && entry.contains("name") && entry.contains("template") && entry["name"].is_string(),
               "{}: chat_template list entries must be {{\"name\": ..., \"template\": ...}}", where);
      if (auto t = consider(entry["name"].get<std::string>(), entry["template"])) return *t;
    }
  } else if (value.is_object()) {
    for (const auto& [name, text] : value.items())
      if (auto t = consider(name, text)) return *t;
  } else {
    fail("{}: chat_template must be a string or a list of named templates, got {}", where, value.type_name());
  }
  fail("{}: the model has several chat templates ({}) and none is named 'default'", where, fmt::join(names, ", "));
}

}  // namespace

nlohmann::json special_token_variables(const nlohmann::json& config) {
  nlohmann::json vars = nlohmann::json::object();
  if (!config.is_object()) return vars;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    auto it = config.find(key);
    if (it == config.end()) continue;
    std::string text;
    if (it->is_string()) text = it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) text = (*it)["content"].get<std::string>();
    if (!text.empty()) vars[key] = text;
  }
  return vars;
}

ChatTemplate ChatTemplate::from_model_dir(const fs::path& dir) {
  const fs::path config_path = dir / "tokenizer_config.json";
  const fs::path jinja_path = dir / "chat_template.jinja";
  nlohmann::json config = nlohmann::json::object();
  if (fs::exists(config_path)) {
    try {
      config = nlohmann::json::parse(read_text(config_path));
    } catch (const nlohmann::json::parse_error& e) {
      fail("{}: invalid JSON: {}", config_path.string(), e.what());
    }
  }
  if (fs::exists(jinja_path)) return from_string(read_text(jinja_path), jinja_path.string(), special_token_variables(config));
  const auto it = config.find("chat_template");
  TP_CHECK(it != config.end() && !it->is_null(),
           "model folder {} has no chat template (neither chat_template.jinja nor a \"chat_template\" in "
           "tokenizer_config.json)",
           dir.string());
  return from_string(pick_template(*it, config_path.string()), config_path.string() + " chat_template",
                     special_token_variables(config));
}

ChatTemplate ChatTemplate::from_string(std::string source, std::string name, nlohmann::json context) {
  TP_CHECK(context.is_null() || context.is_object(), "chat template '{}': the context must be a JSON object", name);
  auto t = std::make_shared<CompiledTemplate>();
  t->source = std::move(source);
  t->name = std::move(name);
  t->context = context.is_null() ? nlohmann::json::object() : std::move(context);
  try {
    t->program = parse_template(t->source, t->name);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // e.g. bad_alloc: still an error that names the template
    fail("chat template '{}': {}", t->name, e.what());
  }
  return ChatTemplate(std::move(t));
}

std::string ChatTemplate::apply(const std::vector<Message>& messages, bool add_generation_prompt) const {
  nlohmann::json list = nlohmann::json::array();
  for (const Message& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return apply(list, add_generation_prompt);
}

std::string ChatTemplate::apply(const nlohmann::json& messages, bool add_generation_prompt,
                                const nlohmann::json& extra) const {
  TP_CHECK(messages.is_array(), "chat template '{}': messages must be a JSON array, got {}", t_->name, messages.type_name());
  TP_CHECK(extra.is_null() || extra.is_object(), "chat template '{}': extra variables must be a JSON object", t_->name);
  Scope globals;
  add_globals(globals);
  for (const auto& [k, v] : t_->context.items()) globals.set(k, Value::from_json(v));
  globals.set("messages", Value::from_json(messages));
  globals.set("add_generation_prompt", Value(add_generation_prompt));
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) globals.set(k, Value::from_json(v));
  try {
    return render(t_->program, globals, t_->source, t_->name);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // e.g. bad_alloc of a runaway string: still an error naming the template
    fail("chat template '{}': {}", t_->name, e.what());
  }
}

const std::string& ChatTemplate::name() const { return t_->name; }
const std::string& ChatTemplate::source() const { return t_->source; }

}  // namespace tp::chat
