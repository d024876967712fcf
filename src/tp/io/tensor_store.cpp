#include "tp/io/tensor_store.h"

#include "tp/io/json_file.h"

namespace tp::io {

namespace fs = std::filesystem;
using nlohmann::json;

bool TensorStore::present(const fs::path& dir, const std::string& prefix) {
  return fs::exists(dir / (prefix + ".safetensors")) || fs::exists(dir / (prefix + ".safetensors.index.json"));
}

TensorStore TensorStore::open(const fs::path& dir, const std::string& prefix) {
  TP_CHECK(fs::is_directory(dir), "model directory {} does not exist or is not a directory", dir.string());
  TensorStore c;
  c.dir_ = dir;
  const fs::path single = dir / (prefix + ".safetensors"), index = dir / (prefix + ".safetensors.index.json");
  if (fs::exists(single)) {
    // Transformers prefers the single file when both exist; so do we.
    c.files_.push_back(SafetensorsFile::open(single));
    for (const TensorInfo& t : c.files_[0]->tensors()) c.where_[t.name] = {0, &t};
  } else if (fs::exists(index)) {
    c.sharded_ = true;
    json j = read_json_file(index);
    TP_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
             "{}: expected an object with a 'weight_map' object of tensor name -> file name", index.string());
    std::unordered_map<std::string, size_t> file_ids;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string& name = it.key();
      TP_CHECK(it.value().is_string(), "{}: weight_map['{}'] must be a file name string, got {}", index.string(),
               name, it.value().dump());
      const std::string file = it.value().get<std::string>();
      fs::path rel(file);
      TP_CHECK(!file.empty() && rel.is_relative() && rel.filename() == rel,
               "{}: weight_map['{}'] = '{}' must be a file name inside the model directory", index.string(), name,
               file);
      auto [fit, inserted] = file_ids.try_emplace(file, c.files_.size());
      if (inserted) {
        TP_CHECK(fs::exists(dir / file), "{}: file '{}' (holding tensor '{}') does not exist in {}", index.string(),
                 file, name, dir.string());
        c.files_.push_back(SafetensorsFile::open(dir / file));
      }
      const TensorInfo* info = c.files_[fit->second]->find(name);
      TP_CHECK(info, "{}: tensor '{}' is listed in {} but {} has no such tensor", (dir / file).string(), name,
               index.filename().string(), file);
      c.where_[name] = {fit->second, info};
    }
  } else {
    fail("{}: no {} or {}", dir.string(), single.filename().string(), index.filename().string());
  }
  return c;
}

std::vector<std::string> TensorStore::tensor_names() const {
  std::vector<std::string> out;
  for (size_t f = 0; f < files_.size(); ++f)
    for (const TensorInfo& t : files_[f]->tensors()) {
      auto it = where_.find(t.name);
      if (it != where_.end() && it->second.file == f) out.push_back(t.name);
    }
  return out;
}

const TensorStore::Location& TensorStore::locate(const std::string& name) const {
  auto it = where_.find(name);
  TP_CHECK(it != where_.end(), "{}: checkpoint has no tensor '{}'", dir_.string(), name);
  return it->second;
}

const TensorInfo& TensorStore::info(const std::string& name) const { return *locate(name).info; }
const SafetensorsFile& TensorStore::file_of(const std::string& name) const { return *files_[locate(name).file]; }

Tensor TensorStore::read(const std::string& name, std::optional<DType> as) const {
  return files_[locate(name).file]->read(name, as);
}

Tensor TensorStore::read_slice(const std::string& name, int64_t dim, const std::vector<ChunkSpan>& spans,
                               std::optional<DType> as) const {
  const Location& l = locate(name);
  return files_[l.file]->read_slice(*l.info, dim, spans, as);
}

}  // namespace tp::io
