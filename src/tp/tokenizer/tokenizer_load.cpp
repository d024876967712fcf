// Builds a TokenizerState from tokenizer.json + tokenizer_config.json.
#include <nlohmann/json.hpp>

#include "tp/core/error.h"
#include "tp/tokenizer/tokenizer_state.h"
#include "tp/tokenizer/utf8.h"

namespace tp {

namespace {

using nlohmann::json;

// A token field of tokenizer_config.json: "text", {"content": "text"} or null.
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  TP_CHECK(v.is_null(), "tokenizer_config.json: {} must be a string, {{\"content\": ...}} or null, got {}", key,
           v.dump());
  return std::nullopt;
}

int64_t id_of(const TokenizerState& s, const std::string& token, std::string_view what) {
  if (const auto id = s.token_to_id(token)) return *id;
  fail("{} '{}' is neither an added token nor in the vocab", what, token);
}

// Ids a post-processor puts around a single sequence.
void load_post_processor(TokenizerState& s, const json& j) {
  if (j.is_null()) return;
  TP_CHECK(j.is_object() && j.contains("type"), "post_processor must be an object with a \"type\", got {}",
           j.dump().substr(0, 200));
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return;  // only adjusts offsets, which tp does not return
  if (type == "Sequence") {
    for (const auto& p : j.at("processors")) load_post_processor(s, p);
    return;
  }
  if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const auto& piece : j.at("single")) {
      if (piece.contains("Sequence")) {
        const auto seq = piece.at("Sequence").at("id").get<std::string>();
        TP_CHECK(seq == "A", "TemplateProcessing single template uses sequence '{}'; only 'A' is accepted", seq);
        seen_sequence = true;
        continue;
      }
      TP_CHECK(piece.contains("SpecialToken"), "TemplateProcessing piece {} is neither SpecialToken nor Sequence",
               piece.dump());
      const auto name = piece.at("SpecialToken").at("id").get<std::string>();
      const json& specials = j.at("special_tokens");
      TP_CHECK(specials.contains(name), "TemplateProcessing names special token '{}' missing from its special_tokens",
               name);
      auto& target = seen_sequence ? s.suffix_ids : s.prefix_ids;
      for (const auto& id : specials.at(name).at("ids")) target.push_back(id.get<int64_t>());
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    s.prefix_ids.push_back(j.at("cls").at(1).get<int64_t>());
    s.suffix_ids.push_back(j.at("sep").at(1).get<int64_t>());
    return;
  }
  fail(
      "post_processor type '{}' is not supported; supported: TemplateProcessing, ByteLevel, RobertaProcessing, "
      "BertProcessing, Sequence",
      type);
}

}  // namespace

std::optional<int64_t> TokenizerState::token_to_id(std::string_view token) const {
  if (const auto it = added_by_content.find(std::string(token)); it != added_by_content.end()) return it->second;
  return model->token_to_id(token);
}

void load_tokenizer_state(TokenizerState& s, const json& tok, const json& config) {
  TP_CHECK(tok.is_object(), "top level must be a JSON object, got {}", tok.type_name());
  TP_CHECK(tok.contains("model"), "missing \"model\"");
  const json& model = tok.at("model");
  const std::string model_type = model.value("type", std::string("BPE"));
  TP_CHECK(model_type == "BPE", "model type '{}' is not supported; supported: BPE", model_type);
  s.model = std::make_unique<Bpe>(model);
  s.normalizer = Normalizer::from_json(tok.value("normalizer", json()));
  s.pre_tokenizer = PreTokenizer::from_json(tok.value("pre_tokenizer", json()));
  s.decoder = Decoder::from_json(tok.value("decoder", json()));

  if (tok.contains("added_tokens") && !tok.at("added_tokens").is_null()) {
    for (const auto& a : tok.at("added_tokens")) {
      AddedToken t;
      t.id = a.at("id").get<int64_t>();
      t.content = a.at("content").get<std::string>();
      TP_CHECK(t.id >= 0, "added token '{}' has negative id {}", t.content, t.id);
      TP_CHECK(!t.content.empty() && utf8::is_valid(t.content), "added token {} has empty or invalid UTF-8 content",
               t.id);
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      t.normalized = a.value("normalized", !t.special);
      s.added.push_back(std::move(t));
    }
  }
  std::vector<const AddedToken*> raw, normalized;
  for (size_t i = 0; i < s.added.size(); ++i) {
    const AddedToken& t = s.added[i];
    s.added_by_id.emplace(t.id, i);
    s.added_by_content.emplace(t.content, t.id);
    // Without a normalizer both sets match the same text; one pass suffices.
    (t.normalized && s.normalizer ? normalized : raw).push_back(&t);
  }
  s.raw_matcher.build(raw);
  s.normalized_matcher.build(normalized);

  load_post_processor(s, tok.value("post_processor", json()));

  if (config.is_object()) {
    if (const auto bos = config_token(config, "bos_token"))
      s.bos_id = id_of(s, *bos, "tokenizer_config.json bos_token");
    if (const auto eos = config_token(config, "eos_token"))
      s.eos_ids.push_back(id_of(s, *eos, "tokenizer_config.json eos_token"));
    // A pad token the vocabulary lacks is one Transformers would add; tp leaves it unset.
    if (const auto pad = config_token(config, "pad_token")) s.pad_id = s.token_to_id(*pad);
    s.clean_up_tokenization_spaces = config.value("clean_up_tokenization_spaces", false);
    // Like Transformers' update_post_processor (LlamaTokenizerFast and
    // others): an explicit add_bos_token/add_eos_token replaces the
    // post-processor with "bos? $A eos?".
    const json& add_bos = config.value("add_bos_token", json());
    const json& add_eos = config.value("add_eos_token", json());
    if (add_bos.is_boolean() || add_eos.is_boolean()) {
      s.prefix_ids.clear();
      s.suffix_ids.clear();
      if (add_bos.is_boolean() && add_bos.get<bool>()) {
        TP_CHECK(s.bos_id, "tokenizer_config.json sets add_bos_token but has no bos_token");
        s.prefix_ids.push_back(*s.bos_id);
      }
      if (add_eos.is_boolean() && add_eos.get<bool>()) {
        TP_CHECK(!s.eos_ids.empty(), "tokenizer_config.json sets add_eos_token but has no eos_token");
        s.suffix_ids.push_back(s.eos_ids.front());
      }
    }
  }
}

}  // namespace tp
