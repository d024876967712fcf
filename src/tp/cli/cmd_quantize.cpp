// `tp quantize`: a Hugging Face checkpoint with its decoder layers' attention, dense MLP, shared and per-expert MoE
// Linears (the Hub's names: quantizable_linear) quantized round-to-nearest (tp/models/quantize_rtn.h) into GPTQ,
// AWQ GEMM or compressed-tensors pack-quantized, with the quantization_config those formats' own tools write;
// everything else (embeddings, lm_head, norms, routers, GPT-OSS's fused experts) is copied as it is and named in
// modules_to_not_convert / ignore. A quantized Linear's bias (Qwen2's q/k/v) is copied next to its codes, as
// GPTQ / AWQ / compressed-tensors checkpoints hold it; a parent module's own parameters (GPT-OSS's attention sinks)
// are copied too, without naming the parent. With --lm-head lm_head is quantized too (GPTQModel's lm_head: true;
// compressed-tensors: left out of ignore), from the embedding where the model ties them; the copy is then written
// untied (tie_word_embeddings false), as GPTQModel's and vLLM's quantized heads are separate tensors: the
// embedding keeps its rows for the lookup.
// The weights are written first and config.json last, so a directory with a config.json is a whole checkpoint.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unordered_set>

#include "tp/cli/command.h"
#include "tp/io/json_file.h"
#include "tp/models/checkpoint.h"
#include "tp/models/quantize_rtn.h"
#include "tp/models/save_pretrained.h"

namespace tp::cli {

namespace {

namespace fs = std::filesystem;

struct Options {
  std::string model, out;
  QuantizeOptions q;
};

std::string module_of(const std::string& name) { return name.substr(0, name.rfind('.')); }

// One quantized Linear's tensors as sources: computed when the first is written, freed after the last; the
// Linear `module` (default: param's), its weight read from `param`.
void add_quantized_sources(const Checkpoint& ckpt, const std::string& param, const QuantizeOptions& q,
                           std::vector<io::TensorSource>& sources, std::string module = "") {
  if (module.empty()) module = module_of(param);
  const DType scale_dtype = ckpt.info(param).dtype;
  // The shapes and dtypes come from quantizing a zero weight of the same size: cheap, and size errors
  // surface here, before anything is written.
  const Shape shape = ckpt.info(param).shape;
  const auto layout = quantize_linear(q, module, Tensor::zeros(shape), scale_dtype);
  auto cache = std::make_shared<std::vector<std::pair<std::string, Tensor>>>();
  for (size_t i = 0; i < layout.size(); ++i) {
    io::TensorSource s{layout[i].first, layout[i].second.dtype(), layout[i].second.shape(), {}, {}};
    s.fill = [&ckpt, param, module, q, scale_dtype, cache, i, last = i + 1 == layout.size()](void* dst) {
      if (cache->empty()) *cache = quantize_linear(q, module, ckpt.read(param, DType::F32), scale_dtype);
      std::memcpy(dst, (*cache)[i].second.raw_data(), (*cache)[i].second.nbytes());
      if (last) cache->clear();
    };
    sources.push_back(std::move(s));
  }
}

void copy_side_files(const fs::path& from, const fs::path& to, const ModelConfig& config) {
  for (const std::string& name : tokenizer_file_names())
    if (fs::exists(from / name)) fs::copy_file(from / name, to / name, fs::copy_options::overwrite_existing);
  if (!fs::exists(from / "generation_config.json")) save_generation_config(to, config);
}

int run(const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  check_quantize_options(o.q);
  std::error_code ec;
  if (fs::exists(o.out) && fs::equivalent(o.model, o.out, ec))
    throw UsageError(fmt::format("--out {} is the model directory; write the quantized copy elsewhere", o.out));
  const Checkpoint ckpt = Checkpoint::open(o.model);
  const ModelConfig& base = ckpt.config();
  if (base.quantization)
    throw UsageError(fmt::format("--model {}: the weights are already quantized (quant_method {})", o.model,
                                 base.quantization->method));

  std::vector<io::TensorSource> sources;
  std::vector<std::string> not_converted, quantized;
  size_t bytes_in = 0;
  for (const std::string& name : ckpt.tensor_names()) {
    const io::TensorInfo& info = ckpt.info(name);
    bytes_in += info.nbytes;
    const bool head = o.q.lm_head && name == "lm_head.weight";
    if ((quantizable_linear(name) || head) && info.shape.size() == 2 && is_floating(info.dtype)) {
      add_quantized_sources(ckpt, name, o.q, sources);
      quantized.push_back(module_of(name));
    } else {
      io::TensorSource s{name, info.dtype, info.shape, {}, {}};
      s.fill = [&ckpt, name](void* dst) {
        const Tensor t = ckpt.read(name);
        std::memcpy(dst, t.raw_data(), t.nbytes());
      };
      sources.push_back(std::move(s));
    }
  }
  nlohmann::json raw = base.raw;
  if (base.tie_word_embeddings && o.q.lm_head) {  // written untied: lm_head quantized from the embedding's weight
    if (!ckpt.has("lm_head.weight")) {
      const std::string embedding = "model.embed_tokens.weight";
      TP_CHECK(ckpt.has(embedding), "--lm-head: {} ties lm_head to the embedding, but has no '{}' to quantize it "
               "from", o.model, embedding);
      add_quantized_sources(ckpt, embedding, o.q, sources, "lm_head");
      quantized.push_back("lm_head");
    }
    raw["tie_word_embeddings"] = false;
  }
  // The modules left as they are, less those holding a quantized Linear: its own bias (Qwen2's q/k/v), or a parent's
  // parameter (GPT-OSS's attention sinks on self_attn), which each format's matching would take to name its children.
  // (Sets: a large MoE checkpoint has tens of thousands of tensors and as many quantized experts.)
  std::unordered_set<std::string> holding_quantized, listed;
  for (const std::string& q : quantized)
    for (size_t end = q.size(); end != std::string::npos && end > 0; end = q.rfind('.', end - 1))
      holding_quantized.insert(q.substr(0, end));
  for (const std::string& name : ckpt.tensor_names()) {
    const std::string m = module_of(name);
    if (!holding_quantized.count(m) && listed.insert(m).second) not_converted.push_back(m);
  }
  if (base.tie_word_embeddings && !o.q.lm_head) not_converted.push_back("lm_head");
  TP_CHECK(!quantized.empty(), "--model {}: no decoder-layer attention, dense MLP or expert Linear to quantize", o.model);

  raw["quantization_config"] = quantization_config_json(o.q, not_converted);
  const ModelConfig config = ModelConfig::from_json(raw, (fs::path(o.out) / "config.json").string());
  // Each format matches modules_to_not_convert its own way (AWQ: substrings): none may catch a quantized module.
  for (const std::string& m : quantized)
    TP_CHECK(config.quantization->quantizes(m), "quantize: the unquantized modules' names would also name '{}' "
             "under {}'s matching rule", m, o.q.format);

  fs::create_directories(o.out, ec);
  TP_CHECK(!ec, "cannot create directory {}: {}", o.out, ec.message());
  fs::remove(fs::path(o.out) / "config.json", ec);
  io::write_weight_files(o.out, sources);
  copy_side_files(o.model, o.out, base);
  io::write_json_file(fs::path(o.out) / "config.json", config.to_json());
  validate_against_config(Checkpoint::open(o.out));

  size_t bytes_out = 0;
  for (const io::TensorSource& s : sources) bytes_out += s.nbytes();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %s %d-bit, group size %lld%s%s, %zu linears quantized, %.1f MB -> %.1f MB (%.1f s)\n",
              o.out.c_str(), o.q.format.c_str(), o.q.bits, static_cast<long long>(o.q.group_size),
              o.q.sym ? ", sym" : "", o.q.desc_act ? ", act-order" : "", quantized.size(), bytes_in / 1e6,
              bytes_out / 1e6, secs);
  return 0;
}

Registrar reg("quantize", "Quantize a checkpoint's Linear weights (round-to-nearest) into GPTQ, AWQ or compressed-tensors",
              [](CLI::App& sub) -> RunFn {
                auto o = std::make_shared<Options>();
                sub.add_option("--model", o->model, "Model directory (config.json + safetensors)")->required();
                sub.add_option("--out", o->out, "Output directory")->required();
                sub.add_option("--format", o->q.format, "gptq, awq or compressed-tensors")->required();
                sub.add_option("--bits", o->q.bits, "4 or 8 (AWQ: 4)")->required();
                sub.add_option("--group-size", o->q.group_size,
                               "Input features per scale: e.g. 32, 64, 128; -1: one per output row (default 128)");
                sub.add_flag("--sym", o->q.sym, "Symmetric (zero point 2^(bits-1)); default asymmetric");
                sub.add_flag("--desc-act", o->q.desc_act,
                             "GPTQ act-order: groups over a seeded permutation of the input features (g_idx)");
                sub.add_option("--checkpoint-format", o->q.checkpoint_format,
                               "GPTQ: gptq (v1, zero points stored minus one; default) or gptq_v2");
                sub.add_option("--seed", o->q.seed, "Seed of act-order's permutation (default 0)");
                sub.add_flag("--lm-head", o->q.lm_head,
                             "Quantize lm_head too (gptq: lm_head true; compressed-tensors: not ignored; a tied "
                             "model is written untied, the embedding kept as it is)");
                return [o] {
                  try {
                    check_quantize_options(o->q);
                  } catch (const Error& e) {
                    throw UsageError(e.what());
                  }
                  return run(*o);
                };
              });

}  // namespace

}  // namespace tp::cli
