#pragma once
// Pre-tokenizers of tokenizer.json ("pre_tokenizer": {...}): split normalized
// text into pieces ("words") that BPE encodes independently.
//
// Pieces are streamed: each stage calls `emit` for every piece it produces,
// and a Sequence chains the stages, so a long input never materializes a list
// of all its pieces.
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <string_view>

namespace tp {

using EmitPiece = std::function<void(std::string_view)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits `text` and emits its pieces in order (never empty ones).
  // `first_section` is true for the text before the first added token
  // (Metaspace's prepend_scheme "first").
  virtual void pre_tokenize(std::string_view text, bool first_section, const EmitPiece& emit) const = 0;

  // nullptr for JSON null; tp::Error naming the type and the supported ones.
  static std::unique_ptr<PreTokenizer> from_json(const nlohmann::json& j);
};

}  // namespace tp
