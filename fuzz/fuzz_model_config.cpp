// libFuzzer target for config.json next to fixed tiny checkpoints: any text must
// end in a config or a tp::Error, never a crash, an abort or a large allocation
// (CTest runs it with -malloc_limit_mb). What an accepted config promises is
// checked below: its layout is exactly the weights it was checked against, and
// writing it back reads back to the same config.
//
// The checkpoints' directories come in TP_FUZZ_CHECKPOINTS (colon-separated);
// only their safetensors headers are read, once.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tp/io/safetensors_header.h"
#include "tp/models/config_check.h"
#include "tp/models/layout.h"
#include "tp/core/error.h"

namespace {

struct FixedCheckpoint {
  std::string dir;
  tp::io::SafetensorsHeader header;
  tp::TensorIndex index;
  int64_t layers = 0;
};

std::vector<FixedCheckpoint> load_checkpoints() {
  const char* env = std::getenv("TP_FUZZ_CHECKPOINTS");
  if (!env || !*env) {
    std::fprintf(stderr, "fuzz_model_config: set TP_FUZZ_CHECKPOINTS to tiny model directories (a:b)\n");
    std::abort();
  }
  std::vector<FixedCheckpoint> out;
  std::stringstream dirs(env);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::ifstream in(dir + "/model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    FixedCheckpoint c{dir, tp::io::parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                             bytes.size(), dir + "/model.safetensors")};
    out.push_back(std::move(c));
  }
  for (FixedCheckpoint& c : out) {  // pointers into the vectors' final places
    for (const tp::io::TensorInfo& t : c.header.tensors) {
      c.index.emplace(t.name, &t);
      if (t.name.rfind("model.layers.", 0) == 0) c.layers = std::max<int64_t>(c.layers, std::atoll(t.name.c_str() + 13) + 1);
    }
  }
  return out;
}

const std::vector<FixedCheckpoint>& checkpoints() {
  static const std::vector<FixedCheckpoint> all = load_checkpoints();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)checkpoints();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tp::ModelConfig config;
  try {
    config = tp::ModelConfig::from_json_text(text, "fuzz/config.json");
  } catch (const tp::Error&) {
    return 0;
  }
  // Writing the config back must read back to the same config.
  const nlohmann::json written = config.to_json();
  try {
    if (tp::ModelConfig::from_json(written, "written").to_json() != written) std::abort();
  } catch (const tp::Error&) {
    std::abort();
  }
  try {
    tp::check_module_tree_fits(config, int64_t{256} << 20);  // pure arithmetic: must not allocate per layer
  } catch (const tp::Error&) {
  }
  for (const FixedCheckpoint& c : checkpoints()) {
    try {
      tp::check_config_against_weights(config, c.index, "fuzz/config.json", c.dir);
    } catch (const tp::Error&) {
      continue;
    }
    if (!tp::has_known_layout(config.model_type)) continue;
    // Accepted: the layout is the checkpoint's, layer for layer and shape for shape.
    if (config.num_hidden_layers != c.layers) std::abort();
    for (const tp::ParamSpec& p : tp::checkpoint_layout(config)) {
      auto it = c.index.find(p.name);
      if (it == c.index.end() || it->second->shape != p.shape) std::abort();
    }
  }
  return 0;
}
