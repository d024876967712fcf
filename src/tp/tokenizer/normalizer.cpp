#include "tp/tokenizer/normalizer.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <nlohmann/json.hpp>

#include "tp/core/error.h"
#include "tp/tokenizer/regex.h"

namespace tp {

namespace {

using nlohmann::json;

enum class Form { NFC, NFD, NFKC, NFKD };

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(Form form) {
    UErrorCode status = U_ZERO_ERROR;
    switch (form) {
      case Form::NFC: impl_ = icu::Normalizer2::getNFCInstance(status); break;
      case Form::NFD: impl_ = icu::Normalizer2::getNFDInstance(status); break;
      case Form::NFKC: impl_ = icu::Normalizer2::getNFKCInstance(status); break;
      case Form::NFKD: impl_ = icu::Normalizer2::getNFKDInstance(status); break;
    }
    TP_CHECK(U_SUCCESS(status), "ICU normalizer unavailable: {}", u_errorName(status));
  }
  void normalize(std::string& text) const override {
    UErrorCode status = U_ZERO_ERROR;
    // Most text is already normalized; skip the UTF-16 round trip then.
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    if (impl_->isNormalized(u, status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    const icu::UnicodeString n = impl_->normalize(u, status);
    TP_CHECK(U_SUCCESS(status), "unicode normalization failed: {}", u_errorName(status));
    text.clear();
    n.toUTF8String(text);
  }

 private:
  const icu::Normalizer2* impl_ = nullptr;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    u.toLower(icu::Locale::getRoot());
    text.clear();
    u.toUTF8String(text);
  }
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class Replace final : public Normalizer {
 public:
  Replace(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override { text = pattern_.replace_all(text, content_); }

 private:
  Regex pattern_;
  std::string content_;
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    // Unicode White_Space via the Oniguruma-compatible \s.
    static const Regex lead("^\\s+", "Strip"), trail("\\s+$", "Strip");
    if (right_)
      for (const auto& [b, e] : trail.find_all(text)) text.erase(b);
    if (left_)
      for (const auto& [b, e] : lead.find_all(text)) text.erase(0, e);
  }

 private:
  bool left_, right_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> items) : items_(std::move(items)) {}
  void normalize(std::string& text) const override {
    for (const auto& n : items_) n->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> items_;
};

}  // namespace

std::unique_ptr<Normalizer> Normalizer::from_json(const json& j) {
  if (j.is_null()) return nullptr;
  TP_CHECK(j.is_object() && j.contains("type"), "normalizer must be an object with a \"type\", got {}",
           j.dump().substr(0, 200));
  const std::string type = j.at("type").get<std::string>();
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(Form::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(Form::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(Form::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(Form::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Prepend") return std::make_unique<Prepend>(j.at("prepend").get<std::string>());
  if (type == "Replace")
    return std::make_unique<Replace>(pattern_from_json(j.at("pattern"), "normalizer Replace"),
                                     j.at("content").get<std::string>());
  if (type == "Strip")
    return std::make_unique<Strip>(j.value("strip_left", true), j.value("strip_right", true));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> items;
    for (const auto& n : j.at("normalizers")) items.push_back(from_json(n));
    std::erase(items, nullptr);
    return std::make_unique<Sequence>(std::move(items));
  }
  fail("normalizer type '{}' is not supported; supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, "
       "Strip, Sequence",
       type);
}

}  // namespace tp
