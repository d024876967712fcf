#include "tp/io/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>

#include "tp/io/json_file.h"
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

void write_weight_files(const fs::path& dir, const std::vector<TensorSource>& tensors, size_t max_shard_bytes,
                        const std::string& prefix) {
  TP_CHECK(max_shard_bytes > 0, "max shard size must be positive");
  TP_CHECK(fs::is_directory(dir), "cannot write weights into {}: not a directory", dir.string());
  const std::regex shard_name(prefix + R"(-\d+-of-\d+\.safetensors)");
  const std::string single = prefix + ".safetensors", index = prefix + ".safetensors.index.json";
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n == single || n == index || std::regex_match(n, shard_name)) fs::remove(e.path());
  }

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
    write_safetensors(dir / single, tensors);
    return;
  }
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string name = fmt::format("{}-{:05d}-of-{:05d}.safetensors", prefix, i + 1, shards.size());
    std::vector<TensorSource> part;
    for (const TensorSource* t : shards[i]) {
      part.push_back(*t);
      weight_map[t->name] = name;
    }
    write_safetensors(dir / name, part);
  }
  json index_json = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_json_file(dir / index, index_json);
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
