#include "tp/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tp/core/error.h"
#include "tp/tokenizer/tokenizer_state.h"
#include "tp/tokenizer/utf8.h"

namespace tp {

namespace {

using nlohmann::json;

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  TP_CHECK(in, "cannot open {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json parse(std::string_view text, std::string_view name) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", name, e.what());
  }
}

}  // namespace

Tokenizer Tokenizer::from_json_text(std::string_view tokenizer_json, std::string_view config_json,
                                    std::string_view name) {
  auto state = std::make_shared<TokenizerState>();
  const json tok = parse(tokenizer_json, name);
  const json config = config_json.empty() ? json() : parse(config_json, "tokenizer_config.json");
  try {
    load_tokenizer_state(*state, tok, config);
  } catch (const json::exception& e) {
    // A field of the wrong type or a missing key.
    fail("{}: malformed: {}", name, e.what());
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    fail("{}: {}", name, e.what());
  }
  return Tokenizer(std::move(state));
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  TP_CHECK(std::filesystem::is_regular_file(tokenizer_json), "tokenizer file {} does not exist",
           tokenizer_json.string());
  const auto dir = tokenizer_json.parent_path();
  const auto config_path = dir / "tokenizer_config.json";
  const std::string config = std::filesystem::exists(config_path) ? read_text(config_path) : std::string();
  Tokenizer t = from_json_text(read_text(tokenizer_json), config, tokenizer_json.string());
  // Chat models list extra stop ids (e.g. <|eot_id|>) in generation_config.json.
  const auto gen_path = dir / "generation_config.json";
  if (std::filesystem::exists(gen_path)) {
    const json gen = parse(read_text(gen_path), gen_path.string());
    auto state = std::const_pointer_cast<TokenizerState>(t.s_);
    if (gen.is_object() && gen.contains("eos_token_id")) {
      const json& e = gen.at("eos_token_id");
      std::vector<int64_t> ids;
      if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
      if (e.is_array())
        for (const auto& x : e) ids.push_back(x.get<int64_t>());
      for (const int64_t id : ids)
        if (std::find(state->eos_ids.begin(), state->eos_ids.end(), id) == state->eos_ids.end())
          state->eos_ids.push_back(id);
    }
  }
  return t;
}

Tokenizer Tokenizer::from_model_dir(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer.json";
  TP_CHECK(std::filesystem::is_regular_file(path), "model folder {} has no tokenizer.json", dir.string());
  return from_file(path);
}

std::vector<int64_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const TokenizerState& s = *s_;
  const std::string valid = utf8::is_valid(input) ? std::string() : utf8::to_valid(input);
  const std::string_view text = valid.empty() ? input : std::string_view(valid);

  std::vector<Segment> raw;
  s.raw_matcher.split(text, raw);

  std::vector<int64_t> ids;
  if (add_special_tokens) ids = s.prefix_ids;
  ids.reserve(ids.size() + text.size() / 3 + 8);
  std::vector<Segment> parts;
  bool first_section = true;
  for (auto& seg : raw) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      first_section = false;
      continue;
    }
    if (s.normalizer) s.normalizer->normalize(seg.text);
    parts.clear();
    s.normalized_matcher.split(seg.text, parts);
    for (auto& part : parts) {
      if (part.added_id >= 0) {
        ids.push_back(part.added_id);
        first_section = false;
        continue;
      }
      if (s.pre_tokenizer)
        s.pre_tokenizer->pre_tokenize(part.text, first_section,
                                      [&](std::string_view piece) { s.model->encode_word(piece, ids); });
      else
        s.model->encode_word(part.text, ids);
      first_section = false;
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), s.suffix_ids.begin(), s.suffix_ids.end());
  return ids;
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  if (const auto it = s_->added_by_id.find(id); it != s_->added_by_id.end()) return s_->added[it->second].content;
  if (const std::string* t = s_->model->id_to_token(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::is_special(int64_t id) const {
  const auto it = s_->added_by_id.find(id);
  return it != s_->added_by_id.end() && s_->added[it->second].special;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  return decode(ids, skip_special_tokens, s_->clean_up_tokenization_spaces);
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens,
                              bool clean_up_tokenization_spaces) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int64_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    auto t = id_to_token(id);
    TP_CHECK(t, "cannot decode token id {}: not in the vocabulary (ids are 0..{})", id, vocab_size() - 1);
    tokens.push_back(std::move(*t));
  }
  std::string text;
  if (s_->decoder) {
    s_->decoder->decode_chain(tokens);
    for (const auto& t : tokens) text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  return clean_up_tokenization_spaces ? clean_up_tokenization(text) : text;
}

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const { return s_->token_to_id(token); }

int64_t Tokenizer::vocab_size() const {
  int64_t m = s_->model->max_id();
  for (const auto& a : s_->added) m = std::max(m, a.id);
  return m + 1;
}

std::optional<int64_t> Tokenizer::bos_token_id() const { return s_->bos_id; }
std::optional<int64_t> Tokenizer::pad_token_id() const { return s_->pad_id; }
std::vector<int64_t> Tokenizer::eos_token_ids() const { return s_->eos_ids; }

std::string clean_up_tokenization(std::string_view text) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  // Applied one rule at a time over the whole text, in this order, as Python's
  // chained str.replace does.
  std::string cur(text);
  for (const auto& [from, to] : kRules) {
    std::string next;
    size_t prev = 0, pos;
    while ((pos = cur.find(from, prev)) != std::string::npos) {
      next.append(cur, prev, pos - prev);
      next += to;
      prev = pos + from.size();
    }
    next.append(cur, prev, std::string::npos);
    cur = std::move(next);
  }
  return cur;
}

}  // namespace tp
