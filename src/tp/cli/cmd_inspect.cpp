// `tp inspect`: validates a model directory (config, every header, index, shapes
// against the config) and lists its tensors; --verify also reads all data.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "tp/cli/command.h"
#include "tp/io/non_finite.h"
#include "tp/models/checkpoint.h"

namespace tp::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Options {
  std::string model;
  bool json = false;
  bool verify = false;
};

std::string rope_summary(const RopeScalingConfig& r) {
  if (r.rope_type == "default") return "default";
  return fmt::format("{} (factor {}, original max positions {})", r.rope_type, r.factor,
                     r.original_max_position_embeddings);
}

int run(const Options& o) {
  Checkpoint ckpt = Checkpoint::open(o.model);
  const ModelConfig& c = ckpt.config();
  std::vector<std::string> names = ckpt.tensor_names();
  size_t total = 0;
  int64_t params = 0;
  for (const std::string& n : names) {
    total += ckpt.info(n).nbytes;
    params += numel(ckpt.info(n).shape);
  }

  size_t verified = 0;
  if (o.verify) {
    for (const std::string& n : names) {
      const io::TensorInfo& t = ckpt.info(n);
      Tensor view = ckpt.read(n);  // zero-copy; reads the pages ahead
      const io::NonFinite bad = io::find_non_finite(view);
      TP_CHECK(bad.count == 0, "{}: tensor '{}' has {} NaN/Inf values (first at flat index {})", t.file.string(), n,
               bad.count, bad.first);
      verified += t.nbytes;
    }
  }

  auto file_of = [&](const std::string& n) { return ckpt.info(n).file.filename().string(); };
  if (o.json) {
    json out = {{"model", o.model}, {"config", c.to_json()}, {"total_bytes", total}, {"parameters", params}, {"sharded", ckpt.sharded()}};
    json files = json::array(), tensors = json::array();
    for (auto& f : ckpt.files())
      files.push_back({{"file", f->path().filename().string()}, {"bytes", f->file_size()}, {"metadata", f->metadata()}});
    for (const std::string& n : names) {
      const io::TensorInfo& t = ckpt.info(n);
      tensors.push_back({{"name", n},
                         {"dtype", io::safetensors_dtype_name(t.dtype)},
                         {"shape", t.shape},
                         {"file", file_of(n)},
                         {"bytes", t.nbytes}});
    }
    out["files"] = files;
    out["tensors"] = tensors;
    if (o.verify) out["verified_bytes"] = verified;
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }

  std::string arch = c.architectures.empty() ? "-" : fmt::format("{}", fmt::join(c.architectures, ","));
  std::printf("model %s\n", o.model.c_str());
  std::printf("  model_type %s (%s), torch_dtype %s\n", c.model_type.c_str(), arch.c_str(), c.torch_dtype.c_str());
  std::printf("  layers %lld, hidden %lld, intermediate %lld, vocab %lld, max positions %lld\n",
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.intermediate_size), static_cast<long long>(c.vocab_size),
              static_cast<long long>(c.max_position_embeddings));
  std::printf("  heads %lld, kv heads %lld, head_dim %lld, tie_word_embeddings %s\n",
              static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_key_value_heads),
              static_cast<long long>(c.head_dim), c.tie_word_embeddings ? "true" : "false");
  std::printf("  rope_theta %g, rope_scaling %s, rms_norm_eps %g\n", c.rope_theta,
              rope_summary(c.rope_scaling).c_str(), c.rms_norm_eps);
  if (!c.base_model_tp_plan.empty()) {
    std::printf("  base_model_tp_plan:\n");
    for (auto& [k, v] : c.base_model_tp_plan) std::printf("    %-40s %s\n", k.c_str(), v.c_str());
  }
  std::printf("files (%zu%s):\n", ckpt.files().size(), ckpt.sharded() ? ", sharded with model.safetensors.index.json" : "");
  for (auto& f : ckpt.files())
    std::printf("  %-40s %zu bytes\n", f->path().filename().string().c_str(), f->file_size());
  std::printf("tensors (%zu, %lld parameters, %zu bytes):\n", names.size(), static_cast<long long>(params), total);
  for (const std::string& n : names) {
    const io::TensorInfo& t = ckpt.info(n);
    std::printf("  %-56s %-5s %-16s %-36s %zu\n", n.c_str(), io::safetensors_dtype_name(t.dtype),
                shape_str(t.shape).c_str(), file_of(n).c_str(), t.nbytes);
  }
  if (o.verify) std::printf("verified %zu bytes: no NaN or Inf\n", verified);
  return 0;
}

Registrar reg("inspect", "Validate a model directory and list its config and tensors", [](CLI::App& sub) -> RunFn {
  auto o = std::make_shared<Options>();
  sub.add_option("--model", o->model, "Model directory (config.json + safetensors)")->required();
  sub.add_flag("--json", o->json, "Print JSON instead of text");
  sub.add_flag("--verify", o->verify, "Also read every tensor and fail on NaN/Inf");
  return [o] { return run(*o); };
});

}  // namespace

}  // namespace tp::cli
