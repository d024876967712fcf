#include "tp/tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "tp/core/error.h"
#include "tp/tokenizer/byte_level.h"
#include "tp/tokenizer/regex.h"
#include "tp/tokenizer/utf8.h"

namespace tp {

namespace {

using nlohmann::json;

// Joins all tokens, maps characters back to bytes and replaces ill-formed
// UTF-8 with U+FFFD (Rust's from_utf8_lossy).
class ByteLevel final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) byte_level::decode_token(t, bytes);
    tokens.assign(1, utf8::to_valid(bytes));
  }
};

class Replace final : public Decoder {
 public:
  Replace(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = pattern_.replace_all(t, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

// Runs of "<0xAB>" tokens become their bytes; a run that is not valid UTF-8
// becomes one U+FFFD per byte, as in Hugging Face tokenizers.
class ByteFallback final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    size_t run = 0;
    auto flush = [&] {
      if (run == 0) return;
      if (utf8::is_valid(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < run; ++i) out.emplace_back(utf8::kReplacement);
      }
      bytes.clear();
      run = 0;
    };
    for (auto& t : tokens) {
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(t[3]) && std::isxdigit(t[4])) {
        bytes.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
        ++run;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class Fuse final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` (one
// character) from every token.
class Strip final : public Decoder {
 public:
  Strip(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    const size_t n = content_.size();
    for (auto& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t i = 0; i < start_ && b + n <= e && t.compare(b, n, content_) == 0; ++i) b += n;
      for (size_t i = 0; i < stop_ && e >= b + n && t.compare(e - n, n, content_) == 0; ++i) e -= n;
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class Metaspace final : public Decoder {
 public:
  Metaspace(std::string replacement, bool strip_first) : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, replacement_.size(), replacement_) == 0) {
          out += ' ';
          k += replacement_.size();
        } else {
          out += t[k++];
        }
      }
      if (i == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> items) : items_(std::move(items)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& d : items_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> items_;
};

}  // namespace

std::unique_ptr<Decoder> Decoder::from_json(const json& j) {
  if (j.is_null()) return nullptr;
  TP_CHECK(j.is_object() && j.contains("type"), "decoder must be an object with a \"type\", got {}",
           j.dump().substr(0, 200));
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Replace")
    return std::make_unique<Replace>(pattern_from_json(j.at("pattern"), "decoder Replace"),
                                     j.at("content").get<std::string>());
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip")
    return std::make_unique<Strip>(j.at("content").get<std::string>(), j.value("start", size_t{0}),
                                   j.value("stop", size_t{0}));
  if (type == "Metaspace") {
    const std::string scheme = j.value("prepend_scheme", std::string(j.value("add_prefix_space", true) ? "always" : "never"));
    return std::make_unique<Metaspace>(j.value("replacement", std::string("\xE2\x96\x81")), scheme != "never");
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> items;
    for (const auto& d : j.at("decoders")) items.push_back(from_json(d));
    std::erase(items, nullptr);
    return std::make_unique<Sequence>(std::move(items));
  }
  fail("decoder type '{}' is not supported; supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, "
       "Sequence",
       type);
}

}  // namespace tp
