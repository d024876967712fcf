#pragma once
// Hugging Face tokenizer.json (byte-level BPE as in Llama 3, Qwen3, DeepSeek-V3,
// GPT-OSS) with encode/decode identical to Transformers' fast tokenizers.
//
// Pipeline (encode): input -> (invalid UTF-8 -> U+FFFD) -> split out added
// tokens -> normalizer -> pre-tokenizer -> BPE per piece -> post-processor
// (BOS/EOS when add_special_tokens). Decode: ids -> token strings -> decoder
// -> optional clean_up_tokenization_spaces.
//
// Invalid UTF-8 input: Transformers only ever sees Python str, so the C++ API
// decides. Each maximal ill-formed subsequence is replaced by U+FFFD, exactly as
// bytes.decode("utf-8", errors="replace") would before calling Transformers.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tp {

struct TokenizerState;

class Tokenizer {
 public:
  // Loads tokenizer.json, and tokenizer_config.json / generation_config.json
  // from the same folder when present.
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);
  static Tokenizer from_model_dir(const std::filesystem::path& dir);
  // From in-memory JSON texts (config_json may be empty). `name` labels errors.
  static Tokenizer from_json_text(std::string_view tokenizer_json, std::string_view config_json = {},
                                  std::string_view name = "tokenizer.json");

  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // clean_up_tokenization_spaces defaults to tokenizer_config.json's value.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens,
                     bool clean_up_tokenization_spaces) const;

  // The token string of an id (added tokens first), nullopt for an unknown id.
  std::optional<std::string> id_to_token(int64_t id) const;
  std::optional<int64_t> token_to_id(std::string_view token) const;
  // Largest id + 1 over the model vocab and the added tokens.
  int64_t vocab_size() const;
  std::optional<int64_t> bos_token_id() const;
  // tokenizer_config.json's pad_token (nullopt without one, or when the vocabulary lacks it).
  std::optional<int64_t> pad_token_id() const;
  std::vector<int64_t> eos_token_ids() const;
  bool is_special(int64_t id) const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerState> state) : s_(std::move(state)) {}
  std::shared_ptr<const TokenizerState> s_;
};

// Transformers' clean_up_tokenization: " ." -> "." and friends.
std::string clean_up_tokenization(std::string_view text);

}  // namespace tp
