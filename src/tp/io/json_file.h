#pragma once
// JSON files as Hugging Face writes them: read with errors that name the file,
// written whole or not at all (a temporary name, then rename).
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace tp::io {

nlohmann::json read_json_file(const std::filesystem::path& file);
// Indent 2, a final newline, as Transformers writes its JSON files.
std::string dump_json(const nlohmann::json& j);
// Writes `text` under a temporary name in the same directory, then renames it over `file`.
void write_text_file(const std::filesystem::path& file, const std::string& text);
inline void write_json_file(const std::filesystem::path& file, const nlohmann::json& j) {
  write_text_file(file, dump_json(j));
}

}  // namespace tp::io
