#include "tp/io/checkpoint.h"

#include <fstream>
#include <set>
#include <sstream>

#include "tp/models/presets.h"

namespace tp::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  TP_CHECK(in, "cannot open {}: {}", file.string(), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", file.string(), e.what());
  }
}

bool is_known_layout(const std::string& model_type) {
  return model_type == "llama" || model_type == "mistral" || model_type == "qwen3";
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& dir) {
  TP_CHECK(fs::is_directory(dir), "model directory {} does not exist or is not a directory", dir.string());
  Checkpoint c;
  c.dir_ = dir;
  TP_CHECK(fs::exists(dir / "config.json"), "{}: no config.json (a Hugging Face model directory needs one)",
           dir.string());
  c.config_ = ModelConfig::load(dir / "config.json");

  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
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
    fail("{}: no model.safetensors or model.safetensors.index.json", dir.string());
  }
  validate_against_config(c);
  return c;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> out;
  for (size_t f = 0; f < files_.size(); ++f)
    for (const TensorInfo& t : files_[f]->tensors()) {
      auto it = where_.find(t.name);
      if (it != where_.end() && it->second.file == f) out.push_back(t.name);
    }
  return out;
}

const Checkpoint::Location& Checkpoint::locate(const std::string& name) const {
  auto it = where_.find(name);
  TP_CHECK(it != where_.end(), "{}: checkpoint has no tensor '{}'", dir_.string(), name);
  return it->second;
}

const TensorInfo& Checkpoint::info(const std::string& name) const { return *locate(name).info; }
const SafetensorsFile& Checkpoint::file_of(const std::string& name) const { return *files_[locate(name).file]; }

Tensor Checkpoint::read(const std::string& name, std::optional<DType> as) const {
  return files_[locate(name).file]->read(name, as);
}

Tensor Checkpoint::read_slice(const std::string& name, int64_t dim, const std::vector<ChunkSpan>& spans,
                              std::optional<DType> as) const {
  const Location& l = locate(name);
  return files_[l.file]->read_slice(*l.info, dim, spans, as);
}

void validate_against_config(const Checkpoint& ckpt) {
  const ModelConfig& c = ckpt.config();
  if (!is_known_layout(c.model_type)) return;
  const std::string cfg = (ckpt.dir() / "config.json").string();
  for (const ParamSpec& p : checkpoint_layout(c)) {
    TP_CHECK(ckpt.has(p.name), "{}: tensor '{}' {} required by {} (model_type {}, {} layers) is missing",
             ckpt.dir().string(), p.name, shape_str(p.shape), cfg, c.model_type, c.num_hidden_layers);
    const TensorInfo& t = ckpt.info(p.name);
    TP_CHECK(t.shape == p.shape, "{}: tensor '{}' has shape {} but {} implies {}", t.file.string(), p.name,
             shape_str(t.shape), cfg, shape_str(p.shape));
    TP_CHECK(is_floating(t.dtype), "{}: tensor '{}' has dtype {}; weights must be F32, BF16 or F16", t.file.string(),
             p.name, safetensors_dtype_name(t.dtype));
  }
}

}  // namespace tp::io
