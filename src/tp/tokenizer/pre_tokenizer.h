#pragma once
// Pre-tokenizers of tokenizer.json ("pre_tokenizer": {...}): split normalized
// text into pieces ("words") that BPE encodes independently.
#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <vector>

namespace tp {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits. `first_section` is true for the text
  // before the first added token (Metaspace's prepend_scheme "first").
  virtual void pre_tokenize(std::vector<std::string>& pieces, bool first_section) const = 0;

  // nullptr for JSON null; tp::Error naming the type and the supported ones.
  static std::unique_ptr<PreTokenizer> from_json(const nlohmann::json& j);
};

}  // namespace tp
