#include "tp/io/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>

#include "tp/io/safetensors_header.h"

namespace tp::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void write_all(int fd, const void* data, size_t n, const fs::path& file) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (w < 0 && errno == EINTR) continue;
    TP_CHECK(w > 0, "writing {}: {}", file.string(), std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  TP_CHECK(out, "cannot create {}: {}", file.string(), std::strerror(errno));
  out << text;
  out.close();
  TP_CHECK(out, "writing {} failed", file.string());
}

// Transformers writes its JSON files with indent=2 and sorted keys (nlohmann's
// default order), plus a final newline.
std::string dump_json(const json& j) { return j.dump(2) + "\n"; }

}  // namespace

TensorSource TensorSource::of(std::string name, const Tensor& t) {
  TP_CHECK(t.defined(), "cannot save tensor '{}': it is undefined", name);
  return TensorSource{std::move(name), t.dtype(), t.shape(), t, {}};
}

void write_safetensors(const fs::path& file, const std::vector<TensorSource>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0, largest_fill = 0;
  for (const TensorSource& t : tensors) {
    TP_CHECK(t.name != "__metadata__" && !t.name.empty(), "{}: invalid tensor name '{}'", file.string(), t.name);
    TP_CHECK(!header.contains(t.name), "{}: tensor '{}' given twice", file.string(), t.name);
    TP_CHECK(t.tensor.defined() || t.fill, "{}: tensor '{}' has neither data nor a fill function", file.string(),
             t.name);
    if (t.tensor.defined())
      TP_CHECK(t.tensor.dtype() == t.dtype && t.tensor.shape() == t.shape,
               "{}: tensor '{}' is {} {} but {} {} was declared", file.string(), t.name, dtype_name(t.tensor.dtype()),
               shape_str(t.tensor.shape()), dtype_name(t.dtype), shape_str(t.shape));
    else
      largest_fill = std::max(largest_fill, t.nbytes());
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  // Pad with spaces so the data area starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  // Written under a temporary name and renamed, so a crash never leaves a
  // truncated file under the real name.
  fs::path tmp = file;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TP_CHECK(fd >= 0, "cannot create {}: {}", tmp.string(), std::strerror(errno));
  try {
    write_all(fd, len, 8, file);
    write_all(fd, text.data(), text.size(), file);
    Tensor buffer;  // reused by every filled tensor: allocated and faulted in once
    if (largest_fill > 0) buffer = Tensor::empty({static_cast<int64_t>((largest_fill + 3) / 4)}, DType::F32);
    for (const TensorSource& t : tensors) {
      if (t.tensor.defined()) {
        write_all(fd, t.tensor.raw_data(), t.nbytes(), file);
      } else {
        t.fill(buffer.raw_data());
        write_all(fd, buffer.raw_data(), t.nbytes(), file);
      }
    }
  } catch (...) {
    ::close(fd);
    fs::remove(tmp);
    throw;
  }
  TP_CHECK(::close(fd) == 0, "closing {}: {}", tmp.string(), std::strerror(errno));
  fs::rename(tmp, file);
}

void save_safetensors(const fs::path& file, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSource> sources;
  for (auto& [name, t] : tensors) sources.push_back(TensorSource::of(name, t));
  write_safetensors(file, sources, metadata);
}

void save_checkpoint(const fs::path& dir, const ModelConfig& config, const std::vector<TensorSource>& tensors,
                     size_t max_shard_bytes) {
  TP_CHECK(max_shard_bytes > 0, "max shard size must be positive");
  std::error_code ec;
  fs::create_directories(dir, ec);
  TP_CHECK(!ec, "cannot create directory {}: {}", dir.string(), ec.message());
  static const std::regex shard_name(R"(model-\d+-of-\d+\.safetensors)");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n == "model.safetensors" || n == "model.safetensors.index.json" || std::regex_match(n, shard_name))
      fs::remove(e.path());
  }
  write_text(dir / "config.json", dump_json(config.to_json()));

  // Transformers' greedy rule: start a new shard when the next tensor would
  // push the current one past the limit (a tensor larger than the limit gets its own).
  std::vector<std::vector<const TensorSource*>> shards(1);
  size_t current = 0, total = 0;
  for (const TensorSource& t : tensors) {
    if (current > 0 && current + t.nbytes() > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(&t);
    current += t.nbytes();
    total += t.nbytes();
  }
  if (shards.size() == 1) {
    write_safetensors(dir / "model.safetensors", tensors);
    return;
  }
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    std::vector<TensorSource> part;
    for (const TensorSource* t : shards[i]) {
      part.push_back(*t);
      weight_map[t->name] = name;
    }
    write_safetensors(dir / name, part);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text(dir / "model.safetensors.index.json", dump_json(index));
}

void save_checkpoint(const fs::path& dir, const ModelConfig& config,
                     const std::vector<std::pair<std::string, Tensor>>& tensors, size_t max_shard_bytes) {
  std::vector<TensorSource> sources;
  for (auto& [name, t] : tensors) sources.push_back(TensorSource::of(name, t));
  save_checkpoint(dir, config, sources, max_shard_bytes);
}

void save_generation_config(const fs::path& dir, const ModelConfig& config) {
  json g = {{"_from_model_config", true}, {"transformers_version", config.raw.value("transformers_version", "4.51.0")}};
  if (config.bos_token_id) g["bos_token_id"] = *config.bos_token_id;
  if (config.eos_token_ids.size() == 1)
    g["eos_token_id"] = config.eos_token_ids[0];
  else if (!config.eos_token_ids.empty())
    g["eos_token_id"] = config.eos_token_ids;
  write_text(dir / "generation_config.json", dump_json(g));
}

size_t parse_size(const std::string& text) {
  static const std::regex re(R"(\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*)", std::regex::icase);
  std::smatch m;
  TP_CHECK(std::regex_match(text, m, re), "invalid size '{}'; expected e.g. 5GB, 500MB, 2GiB or a byte count", text);
  double v = std::stod(m[1].str());
  std::string unit = m[2].str();
  std::transform(unit.begin(), unit.end(), unit.begin(), ::toupper);
  double scale = 1;
  if (!unit.empty() && unit != "B") {
    const bool binary = unit.size() == 3;
    const int power = std::string("KMGT").find(unit[0]) + 1;
    for (int i = 0; i < power; ++i) scale *= binary ? 1024.0 : 1000.0;
  }
  TP_CHECK(v * scale >= 1, "invalid size '{}': must be at least one byte", text);
  return static_cast<size_t>(v * scale);
}

}  // namespace tp::io
