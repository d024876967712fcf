#include "tp/training/data.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tp/tensor/random.h"

namespace tp::training {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& file) {
  TP_CHECK(fs::exists(file), "data file {} does not exist", file.string());
  TP_CHECK(!fs::is_directory(file), "data file {} is a directory; pass the files in it", file.string());
  std::ifstream in(file, std::ios::binary);
  TP_CHECK(in, "cannot open data file {}: {}", file.string(), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_json_lines(const fs::path& file) {
  const std::string ext = file.extension().string();
  return ext == ".jsonl" || ext == ".json";
}

bool blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

std::vector<std::string> json_documents(const fs::path& file, const std::string& text) {
  std::vector<std::string> docs;
  std::vector<std::string> lines = split_lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (blank(lines[i])) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(lines[i]);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: not a JSON object ({}); JSON lines data needs one {{\"text\": ...}} object per line",
           file.string(), i + 1, e.what());
    }
    TP_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(),
             "{}:{}: expected an object with a string \"text\" field, got {}", file.string(), i + 1,
             j.dump().substr(0, 80));
    docs.push_back(j["text"].get<std::string>());
  }
  return docs;
}

std::vector<std::string> text_documents(const std::string& text, const std::string& sample_by) {
  if (sample_by == "document") return blank(text) ? std::vector<std::string>{} : std::vector<std::string>{text};
  std::vector<std::string> docs;
  std::string paragraph;
  for (std::string& line : split_lines(text)) {
    if (sample_by == "line") {
      if (!blank(line)) docs.push_back(std::move(line));
      continue;
    }
    if (blank(line)) {
      if (!paragraph.empty()) docs.push_back(std::move(paragraph));
      paragraph.clear();
    } else {
      paragraph += paragraph.empty() ? line : "\n" + line;
    }
  }
  if (!paragraph.empty()) docs.push_back(std::move(paragraph));
  return docs;
}

}  // namespace

TokenBlocks TokenBlocks::from_files(const std::vector<fs::path>& files, const Tokenizer& tokenizer,
                                    const TextDataOptions& options) {
  TP_CHECK(!files.empty(), "no data files given");
  TP_CHECK(options.seq_len >= 2, "seq_len must be at least 2 (a token and the next one to predict), got {}",
           options.seq_len);
  TP_CHECK(options.sample_by == "line" || options.sample_by == "paragraph" || options.sample_by == "document",
           "sample_by '{}' is not supported; supported: line, paragraph, document", options.sample_by);
  std::vector<int64_t> eos = tokenizer.eos_token_ids();
  TP_CHECK(!eos.empty(), "the tokenizer has no EOS token to put between documents (tokenizer_config.json's "
           "eos_token or the model's generation_config.json)");
  TokenBlocks out;
  out.seq_len_ = options.seq_len;
  std::vector<std::string> names;
  for (const fs::path& file : files) {
    std::string text = read_file(file);
    std::vector<std::string> docs =
        is_json_lines(file) ? json_documents(file, text) : text_documents(text, options.sample_by);
    TP_CHECK(!docs.empty(), "data file {} holds no text", file.string());
    // Documents are independent: tokenize them in parallel, concatenate in order.
    std::vector<std::vector<int64_t>> ids(docs.size());
#pragma omp parallel for schedule(dynamic, 64)
    for (size_t i = 0; i < docs.size(); ++i) ids[i] = tokenizer.encode(docs[i]);
    for (std::vector<int64_t>& doc : ids) {
      if (doc.empty() || doc.back() != eos[0]) doc.push_back(eos[0]);
      for (int64_t id : doc) out.tokens_.push_back(static_cast<int32_t>(id));
    }
    out.documents_ += static_cast<int64_t>(docs.size());
    names.push_back(file.string());
  }
  out.source_ = fmt::format("{}", fmt::join(names, ", "));
  const int64_t total = static_cast<int64_t>(out.tokens_.size());
  TP_CHECK(total >= options.seq_len,
           "{} tokenize to {} tokens, fewer than one block of seq_len {}: lower --seq-len or add data", out.source_,
           total, options.seq_len);
  out.dropped_ = total % options.seq_len;
  out.tokens_.resize(static_cast<size_t>(total - out.dropped_));
  return out;
}

TokenBlocks TokenBlocks::from_tokens(std::vector<int32_t> tokens, int64_t seq_len, std::string source) {
  TP_CHECK(seq_len >= 2, "seq_len must be at least 2, got {}", seq_len);
  TP_CHECK(static_cast<int64_t>(tokens.size()) >= seq_len, "{}: {} tokens, fewer than one block of {}", source,
           tokens.size(), seq_len);
  TokenBlocks out;
  out.seq_len_ = seq_len;
  out.source_ = std::move(source);
  out.dropped_ = static_cast<int64_t>(tokens.size()) % seq_len;
  tokens.resize(tokens.size() - static_cast<size_t>(out.dropped_));
  out.tokens_ = std::move(tokens);
  return out;
}

uint64_t TokenBlocks::fingerprint() const {
  uint64_t h = mix64(static_cast<uint64_t>(seq_len_));
  for (int32_t t : tokens_) h = mix64(h ^ static_cast<uint32_t>(t));
  return h;
}

Tensor TokenBlocks::batch(const std::vector<int64_t>& indices) const {
  std::vector<int64_t> out;
  out.reserve(indices.size() * static_cast<size_t>(seq_len_));
  for (int64_t block : indices) {
    TP_CHECK(block >= 0 && block < size(), "block {} is outside [0, {})", block, size());
    const int32_t* src = tokens_.data() + block * seq_len_;
    out.insert(out.end(), src, src + seq_len_);
  }
  return Tensor::from_ints(out, {static_cast<int64_t>(indices.size()), seq_len_});
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (!shuffle) return order;
  uint64_t state = mix64(seed ^ mix64(static_cast<uint64_t>(epoch) + 0x5851f42d4c957f2dull));
  for (int64_t i = n - 1; i > 0; --i) {
    state = mix64(state);
    // Multiply-shift maps 64 random bits onto [0, i] (bias below 2^-40 for any realistic n).
    const int64_t j = static_cast<int64_t>((static_cast<unsigned __int128>(state) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace tp::training
