// `tp tokenize` and `tp detokenize`: the tokenizer of a model from the shell.
//   tp tokenize   --model DIR | --tokenizer FILE (--text T | --text-file F) [--json] [--no-special-tokens]
//   tp detokenize --model DIR | --tokenizer FILE --ids 1,2,3 [--skip-special-tokens]
#include <nlohmann/json.hpp>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tp/cli/command.h"
#include "tp/core/error.h"
#include "tp/tokenizer/tokenizer.h"

namespace tp::cli {
namespace {

struct Source {
  std::string model_dir, tokenizer_file;

  void add_flags(CLI::App& sub) {
    sub.add_option("--model", model_dir, "model folder holding tokenizer.json");
    sub.add_option("--tokenizer", tokenizer_file, "a tokenizer.json file");
  }
  Tokenizer load() const {
    if (model_dir.empty() == tokenizer_file.empty())
      throw UsageError("give exactly one of --model DIR or --tokenizer FILE");
    return model_dir.empty() ? Tokenizer::from_file(tokenizer_file) : Tokenizer::from_model_dir(model_dir);
  }
};

std::vector<int64_t> parse_ids(const std::string& list) {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int64_t id = 0;
    const auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || id < 0)
      throw UsageError(fmt::format("--ids: '{}' is not a token id; expected non-negative integers like 1,2,3", item));
    ids.push_back(id);
    start = end + 1;
  }
  return ids;
}

Registrar tokenize_cmd("tokenize", "print the token ids of a text", [](CLI::App& sub) {
  auto source = std::make_shared<Source>();
  auto text = std::make_shared<std::string>();
  auto text_file = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto no_special = std::make_shared<bool>(false);
  source->add_flags(sub);
  auto* t = sub.add_option("--text", *text, "the text to tokenize");
  auto* f = sub.add_option("--text-file", *text_file, "a file whose whole content is tokenized");
  t->excludes(f);
  sub.add_flag("--json", *json, "print {\"ids\": [...], \"tokens\": [...]} instead of comma-separated ids");
  sub.add_flag("--no-special-tokens", *no_special, "do not add BOS/EOS (add_special_tokens=False)");
  return [=, &sub]() -> int {
    if (sub.count("--text") == 0 && sub.count("--text-file") == 0)
      throw UsageError("give the text with --text T or --text-file F");
    std::string input = *text;
    if (sub.count("--text-file")) {
      std::ifstream in(*text_file, std::ios::binary);
      TP_CHECK(in, "cannot open --text-file {}", *text_file);
      std::ostringstream ss;
      ss << in.rdbuf();
      input = ss.str();
    }
    const Tokenizer tok = source->load();
    const auto ids = tok.encode(input, !*no_special);
    if (*json) {
      nlohmann::json out;
      out["ids"] = ids;
      out["tokens"] = nlohmann::json::array();
      for (const int64_t id : ids) out["tokens"].push_back(tok.id_to_token(id).value_or(""));
      std::printf("%s\n", out.dump().c_str());
    } else {
      std::printf("%s\n", fmt::format("{}", fmt::join(ids, ",")).c_str());
    }
    return 0;
  };
});

Registrar detokenize_cmd("detokenize", "print the text of token ids", [](CLI::App& sub) {
  auto source = std::make_shared<Source>();
  auto ids = std::make_shared<std::string>();
  auto skip = std::make_shared<bool>(false);
  source->add_flags(sub);
  sub.add_option("--ids", *ids, "comma-separated token ids, e.g. 1,2,3")->required();
  sub.add_flag("--skip-special-tokens", *skip, "leave out special tokens such as <|eot_id|>");
  return [=]() -> int {
    const auto list = parse_ids(*ids);
    const Tokenizer tok = source->load();
    const std::string text = tok.decode(list, *skip);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  };
});

}  // namespace
}  // namespace tp::cli
