#pragma once
// Decoders of tokenizer.json ("decoder": {...}): token strings -> text. Each
// stage maps a list of token strings to a list of strings (Hugging Face's
// decode_chain); the result is their concatenation.
#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <vector>

namespace tp {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;

  // nullptr for JSON null; tp::Error naming the type and the supported ones.
  static std::unique_ptr<Decoder> from_json(const nlohmann::json& j);
};

}  // namespace tp
