#include "tp/models/config_check.h"

#include <algorithm>
#include <optional>

#include "tp/models/layout.h"
#include "tp/models/mxfp4.h"
#include "tp/models/moe_checkpoint.h"
#include "tp/models/quantized_shapes.h"
#include "tp/core/error.h"

namespace tp {

namespace {

constexpr std::string_view kLayerPrefix = "model.layers.";

// N of "model.layers.N.<rest>", or nothing for other names.
std::optional<int64_t> layer_index(const std::string& name) {
  if (name.compare(0, kLayerPrefix.size(), kLayerPrefix) != 0) return std::nullopt;
  int64_t n = 0;
  size_t i = kLayerPrefix.size(), digits = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i, ++digits) {
    if (digits == 12) return std::nullopt;  // no checkpoint has that many layers; not a layer index
    n = n * 10 + (name[i] - '0');
  }
  if (digits == 0 || i >= name.size() || name[i] != '.') return std::nullopt;
  return n;
}

struct Checker {
  const ModelConfig& c;
  const TensorIndex& tensors;
  const std::string& cfg;
  const std::string& dir;

  const io::TensorInfo* find(const std::string& name) const {
    auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : it->second;
  }
  // The tensor if present with `rank` dims; the full layout check reports the rest.
  const io::TensorInfo* shaped(const std::string& name, size_t rank) const {
    const io::TensorInfo* t = find(name);
    return t && t->shape.size() == rank ? t : nullptr;
  }
  std::string where(const io::TensorInfo& t) const {
    return fmt::format("{}: '{}' is {}", t.file.string(), t.name, shape_str(t.shape));
  }

  void layer_count() const {
    int64_t max_index = -1;
    for (const auto& [name, info] : tensors)
      if (std::optional<int64_t> i = layer_index(name)) max_index = std::max(max_index, *i);
    const int64_t held = max_index + 1;
    if (held == c.num_hidden_layers) return;  // a gap inside is a missing tensor, named by the layout check
    if (held == 0)
      fail("{}: 'num_hidden_layers' is {} but the weights in {} hold no layers (no model.layers.N.* tensor)", cfg,
           c.num_hidden_layers, dir);
    fail("{}: 'num_hidden_layers' is {} but the weights in {} hold {} layer{} (model.layers.0 to model.layers.{})",
         cfg, c.num_hidden_layers, dir, held, held == 1 ? "" : "s", max_index);
  }

  void embeddings() const {
    const io::TensorInfo* e = shaped("model.embed_tokens.weight", 2);
    if (!e) return;
    TP_CHECK(e->shape[1] == c.hidden_size, "{}: 'hidden_size' is {} but the weights have hidden size {} ({})", cfg,
             c.hidden_size, e->shape[1], where(*e));
    TP_CHECK(e->shape[0] == c.vocab_size, "{}: 'vocab_size' is {} but the weights have {} token embeddings ({})", cfg,
             c.vocab_size, e->shape[0], where(*e));
    TP_CHECK(c.tie_word_embeddings || find("lm_head.weight") || find("lm_head.qweight") ||
                 find("lm_head.weight_packed"),
             "{}: 'tie_word_embeddings' is false but the weights in {} have no lm_head.weight (nor a quantized "
             "lm_head); a checkpoint whose lm_head shares model.embed_tokens.weight says \"tie_word_embeddings\": true",
             cfg, dir);
  }

  // The architecture's attention sizes its projections by heads x head_dim
  // (MLA's are not: deepseek_config.h), as the layout from its module tree says.
  static bool heads_by_head_dim(const std::vector<ParamSpec>& layout, const ModelConfig& c) {
    for (const ParamSpec& p : layout)
      if (p.name == "model.layers.0.self_attn.q_proj.weight") return p.shape[0] == c.num_attention_heads * c.head_dim;
    return false;
  }

  void attention() const {
    const bool head_dim_given = c.raw.is_object() && c.raw.contains("head_dim") && !c.raw["head_dim"].is_null();
    const std::string hd = head_dim_given ? fmt::format("'head_dim' ({})", c.head_dim)
                                          : fmt::format("head_dim ({} = hidden_size / num_attention_heads)", c.head_dim);
    if (const io::TensorInfo* qn = shaped("model.layers.0.self_attn.q_norm.weight", 1))
      TP_CHECK(qn->shape[0] == c.head_dim, "{}: {} does not match the weights' head_dim {} ({})", cfg, hd,
               qn->shape[0], where(*qn));
    if (const io::TensorInfo* q = shaped("model.layers.0.self_attn.q_proj.weight", 2))
      TP_CHECK(q->shape[0] == c.num_attention_heads * c.head_dim,
               "{}: 'num_attention_heads' ({}) x {} = {} but the weights' query projection has {} rows ({})", cfg,
               c.num_attention_heads, hd, c.num_attention_heads * c.head_dim, q->shape[0], where(*q));
    if (const io::TensorInfo* k = shaped("model.layers.0.self_attn.k_proj.weight", 2))
      TP_CHECK(k->shape[0] == c.num_key_value_heads * c.head_dim,
               "{}: 'num_key_value_heads' ({}) x {} = {} but the weights' key projection has {} rows ({})", cfg,
               c.num_key_value_heads, hd, c.num_key_value_heads * c.head_dim, k->shape[0], where(*k));
  }

  void mlp() const {
    if (const io::TensorInfo* g = shaped("model.layers.0.mlp.gate_proj.weight", 2))
      TP_CHECK(g->shape[0] == c.intermediate_size, "{}: 'intermediate_size' is {} but the weights have {} ({})", cfg,
               c.intermediate_size, g->shape[0], where(*g));
  }

  // A per-expert (or renamed) Hub tensor of a checkpoint that holds the fused parameter instead.
  bool already_fused(const ParamSpec& p) const {
    const std::optional<FusedLocation> at = fused_location(p.name, 2 * p.shape[0]);
    return at && find(at->param) != nullptr;
  }

  void check_mxfp4(const ParamSpec& p) const {
    const std::pair<std::string, Shape> want[] = {{p.name + "_blocks", mxfp4_blocks_shape(p.name, p.shape)},
                                                   {p.name + "_scales", mxfp4_scales_shape(p.name, p.shape)}};
    for (const auto& [name, shape] : want) {
      const io::TensorInfo* t = find(name);
      TP_CHECK(t, "{}: tensor '{}' {} (MXFP4 '{}' {}) is missing", dir, name, shape_str(shape), p.name,
               shape_str(p.shape));
      TP_CHECK(t->shape == shape && t->dtype == DType::U8, "{}: MXFP4 tensor '{}' is {} {}, but {} implies U8 {}",
               t->file.string(), name, io::safetensors_dtype_name(t->dtype), shape_str(t->shape), cfg,
               shape_str(shape));
    }
  }

  // A Linear stored as a quantized checkpoint's packed tensors (quantized_shapes.h) instead of `.weight`.
  bool stored_packed(const ParamSpec& p) const {
    if (p.shape.size() != 2 || !p.name.ends_with(".weight")) return false;
    const std::string module = p.name.substr(0, p.name.size() - 7);
    const io::TensorInfo* packed = find(module + ".qweight");
    if (!packed) packed = find(module + ".weight_packed");
    if (!packed) return false;
    const std::optional<QuantizationConfig>& q = c.quantization;
    TP_CHECK(q && q->packs_linears(),
             "{}: tensor '{}' holds '{}' quantized, but {} has no quantization_config (gptq, awq or "
             "compressed-tensors) saying how it is packed", packed->file.string(), packed->name, p.name, cfg);
    TP_CHECK(q->quantizes(module), "{}: tensor '{}' holds '{}' quantized, but {}'s quantization_config leaves "
             "'{}' unquantized (modules_to_not_convert / ignore)", packed->file.string(), packed->name, p.name, cfg,
             module);
    check_packed_tensors(*q, module, p.shape, [this](const std::string& n) { return find(n); }, cfg, dir);
    return true;
  }

  // Every tensor.
  void layout(const std::vector<ParamSpec>& expected) const {
    for (const ParamSpec& p : expected) {
      const io::TensorInfo* t = find(p.name);
      if (!t && already_fused(p)) continue;
      if (!t && stored_packed(p)) continue;
      if (!t && find(p.name + "_blocks") != nullptr) {  // MXFP4 (mxfp4.h): both tensors' shapes and dtypes
        check_mxfp4(p);
        continue;
      }
      TP_CHECK(t, "{}: tensor '{}' {} required by {} (model_type {}, {} layers) is missing", dir, p.name,
               shape_str(p.shape), cfg, c.model_type, c.num_hidden_layers);
      TP_CHECK(t->shape == p.shape, "{}: tensor '{}' has shape {} but {} implies {}", t->file.string(), p.name,
               shape_str(t->shape), cfg, shape_str(p.shape));
      TP_CHECK(is_floating(t->dtype), "{}: tensor '{}' has dtype {}; weights must be F32, BF16 or F16",
               t->file.string(), p.name, io::safetensors_dtype_name(t->dtype));
    }
  }
};

std::string gib(int64_t bytes) { return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30)); }

}  // namespace

void check_module_tree_fits(const ModelConfig& config, int64_t memory_bytes) {
  const int64_t layers = config.num_hidden_layers;
  if (layers <= memory_bytes / 2 / kModuleTreeBytesPerLayer) return;
  const int64_t params = estimated_parameter_count(config);  // a count that overflows fails here, named
  fail("{}: 'num_hidden_layers' is {}: building the module tree alone would take about {}, more than half of "
       "this machine's {} (the model would have about {:.3g} parameters); is the value a typo?",
       config.source, layers, gib(layers * kModuleTreeBytesPerLayer), gib(memory_bytes),
       static_cast<double>(params));
}

void check_config_against_weights(const ModelConfig& config, const TensorIndex& tensors, const std::string& config_file,
                                  const std::string& weights_dir) {
  if (!has_known_layout(config.model_type)) return;
  const Checker check{config, tensors, config_file, weights_dir};
  check.layer_count();
  check.embeddings();
  const std::vector<ParamSpec> layout = checkpoint_layout(config);  // bounded: the layer count is the weights'

  // The keys that size the attention named first where they size it; else the layout check names the tensors.
  if (Checker::heads_by_head_dim(layout, config)) check.attention();
  check.mlp();
  check.layout(layout);
}

}  // namespace tp
