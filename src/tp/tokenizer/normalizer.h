#pragma once
// Normalizers of tokenizer.json ("normalizer": {...}): text -> text, applied to
// the parts of the input that are not added tokens.
#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

namespace tp {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;

  // nullptr for JSON null; tp::Error naming the type and the supported ones
  // for anything else unknown.
  static std::unique_ptr<Normalizer> from_json(const nlohmann::json& j);
};

}  // namespace tp
