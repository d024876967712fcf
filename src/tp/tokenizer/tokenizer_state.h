#pragma once
// The parts of a loaded Tokenizer (shared, immutable after loading).
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tp/tokenizer/added_vocabulary.h"
#include "tp/tokenizer/bpe.h"
#include "tp/tokenizer/decoder.h"
#include "tp/tokenizer/normalizer.h"
#include "tp/tokenizer/pre_tokenizer.h"

namespace tp {

struct TokenizerState {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> model;
  std::unique_ptr<Decoder> decoder;

  // Post-processing of a single sequence: ids around it when add_special_tokens.
  std::vector<int64_t> prefix_ids, suffix_ids;

  std::vector<AddedToken> added;
  std::unordered_map<int64_t, size_t> added_by_id;  // id -> index in `added`
  std::unordered_map<std::string, int64_t> added_by_content;
  AddedTokenMatcher raw_matcher, normalized_matcher;

  std::optional<int64_t> bos_id;
  std::optional<int64_t> pad_id;  // tokenizer_config.json's pad_token, when the vocabulary has it
  std::vector<int64_t> eos_ids;
  bool clean_up_tokenization_spaces = false;

  // An added token's id, else the model vocabulary's; nullopt when neither has it.
  std::optional<int64_t> token_to_id(std::string_view token) const;
};

// Fills `s` from parsed tokenizer.json and tokenizer_config.json (may be null).
void load_tokenizer_state(TokenizerState& s, const nlohmann::json& tok, const nlohmann::json& config);

}  // namespace tp
