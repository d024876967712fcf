#include "tp/models/quantize_rtn.h"

#include <random>
#include <regex>

#include "tp/core/error.h"
#include "tp/io/quantized_words.h"
#include "tp/io/round_to_nearest.h"

namespace tp {

namespace {

// Each input feature's group: k / g, or under act-order the rank of k in a seeded permutation / g
// (GPTQ's act-order quantizes in a permuted order and records each feature's group in g_idx).
std::vector<int32_t> feature_groups(const QuantizeOptions& o, const std::string& module, int64_t K) {
  std::vector<int32_t> grp(K, 0);
  const int64_t g = o.group_size == -1 ? K : o.group_size;
  std::vector<int64_t> order(K);
  for (int64_t k = 0; k < K; ++k) order[k] = k;
  if (o.desc_act) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name: each module its own permutation, on any platform
    for (unsigned char c : module) h = (h ^ c) * 0x100000001b3ull;
    std::mt19937_64 rng(o.seed ^ h);
    for (int64_t i = K - 1; i > 0; --i) std::swap(order[i], order[static_cast<int64_t>(rng() % (i + 1))]);
  }
  for (int64_t i = 0; i < K; ++i) grp[order[i]] = static_cast<int32_t>(i / g);
  return grp;
}

// The rounded weight with its sizes and each input feature's group.
struct Quantized : io::RoundedWeight {
  int64_t N, K, G;
  std::vector<int32_t> grp;  // [K]
};

Quantized round_to_nearest(const QuantizeOptions& o, const std::string& module, const Tensor& w, DType scale_dtype) {
  Quantized q;
  q.N = w.size(0);
  q.K = w.size(1);
  q.G = o.group_size == -1 ? 1 : q.K / o.group_size;
  q.grp = feature_groups(o, module, q.K);
  const io::RoundToNearest rtn{o.bits, o.sym, o.format == "gptq" && o.checkpoint_format == "gptq", scale_dtype};
  static_cast<io::RoundedWeight&>(q) = io::round_to_nearest(rtn, w, q.grp, q.G, module);
  return q;
}

// The scales as stored: [N, G] or [G, N], in dtype d (their values are d's already).
Tensor scales_tensor(const Quantized& q, DType d, bool transposed) {
  return (transposed ? q.scales.transpose(0, 1) : q.scales).to(d);
}

std::vector<std::pair<std::string, Tensor>> pack_gptq(const QuantizeOptions& o, const std::string& m, const Quantized& q) {
  // Codes packed along K, words [K / pf, N]; zero points along N, words [G, N / pf] (v1: z - 1).
  const int minus = o.checkpoint_format == "gptq" ? 1 : 0;
  Tensor qweight = io::pack_words(q.codes, {o.bits, 1, true, false});
  Tensor qzeros = io::pack_words(q.zeros, {o.bits, 0, true, false}, minus);
  std::vector<int64_t> groups(q.grp.begin(), q.grp.end());
  return {{m + ".qweight", qweight}, {m + ".qzeros", qzeros}, {m + ".scales", scales_tensor(q, DType::F16, true)},
          {m + ".g_idx", Tensor::from_ints(groups, {q.K}, DType::I32)}};
}

std::vector<std::pair<std::string, Tensor>> pack_awq(const std::string& m, const Quantized& q) {
  // Codes and zero points packed along N in AutoAWQ's interleaved order: words [K, N / 8] and [G, N / 8].
  Tensor qweight = io::pack_words(q.codes, {4, 0, true, true}), qzeros = io::pack_words(q.zeros, {4, 0, true, true});
  return {{m + ".qweight", qweight}, {m + ".qzeros", qzeros}, {m + ".scales", scales_tensor(q, DType::F16, true)}};
}

std::vector<std::pair<std::string, Tensor>> pack_compressed_tensors(const QuantizeOptions& o, const std::string& m,
                                                                    const Quantized& q, DType scale_dtype) {
  // Codes packed along K, words [N, K / pf].
  std::vector<std::pair<std::string, Tensor>> out = {{m + ".weight_packed", io::pack_words(q.codes, {o.bits, 1, false, false})},
                                                     {m + ".weight_scale", scales_tensor(q, scale_dtype, false)}};
  if (!o.sym)  // pack_to_int32 along dim 0 (out features), unsigned like the codes: words [N / pf, G]
    out.emplace_back(m + ".weight_zero_point", io::pack_words(q.zeros, {o.bits, 0, false, false}));
  out.emplace_back(m + ".weight_shape", Tensor::from_ints({q.N, q.K}, {2}, DType::I64));
  return out;
}

}  // namespace

void check_quantize_options(const QuantizeOptions& o) {
  TP_CHECK(o.format == "gptq" || o.format == "awq" || o.format == "compressed-tensors",
           "--format {}: supported: gptq, awq, compressed-tensors", o.format);
  TP_CHECK(o.bits == 4 || o.bits == 8, "--bits {}: supported: 4, 8", o.bits);
  TP_CHECK(o.format != "awq" || o.bits == 4, "--bits {}: AWQ GEMM checkpoints hold 4-bit weights only", o.bits);
  TP_CHECK(o.format != "awq" || !o.sym, "--sym: AWQ GEMM checkpoints carry zero points (zero_point true); "
           "quantize symmetric weights as gptq or compressed-tensors");
  TP_CHECK(o.group_size == -1 || (o.group_size > 0 && o.group_size % (32 / o.bits) == 0),
           "--group-size {}: -1 (one group per output row) or a positive multiple of {} (values per int32 word)",
           o.group_size, 32 / o.bits);
  TP_CHECK(!o.desc_act || o.format == "gptq", "--desc-act: only GPTQ checkpoints have act-order (g_idx)");
  TP_CHECK(!o.lm_head || o.format != "awq", "--lm-head: AWQ GEMM checkpoints keep lm_head unquantized (AutoAWQ "
           "quantizes decoder layers only); quantize lm_head as gptq or compressed-tensors");
  TP_CHECK(o.checkpoint_format == "gptq" || o.checkpoint_format == "gptq_v2",
           "--checkpoint-format {}: supported: gptq (v1), gptq_v2", o.checkpoint_format);
}

nlohmann::json quantization_config_json(const QuantizeOptions& o, const std::vector<std::string>& not_converted) {
  using nlohmann::json;
  if (o.format == "gptq")
    return {{"quant_method", "gptq"}, {"bits", o.bits}, {"group_size", o.group_size}, {"desc_act", o.desc_act},
            {"sym", o.sym}, {"lm_head", o.lm_head}, {"checkpoint_format", o.checkpoint_format},
            {"modules_to_not_convert", not_converted}, {"meta", {{"quantizer", {"tp quantize (round-to-nearest)"}}}}};
  if (o.format == "awq")
    return {{"quant_method", "awq"}, {"bits", o.bits}, {"group_size", o.group_size}, {"zero_point", true},
            {"version", "gemm"}, {"modules_to_not_convert", not_converted}};
  const bool channel = o.group_size == -1;
  json weights = {{"num_bits", o.bits}, {"type", "int"}, {"symmetric", o.sym},
                  {"strategy", channel ? "channel" : "group"}, {"group_size", channel ? json() : json(o.group_size)},
                  {"dynamic", false}, {"actorder", nullptr}, {"observer", "minmax"}, {"observer_kwargs", json::object()},
                  {"block_structure", nullptr}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups",
           {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", nullptr},
                         {"output_activations", nullptr}, {"format", "pack-quantized"}}}}},
          {"ignore", not_converted},
          {"kv_cache_scheme", nullptr},
          {"sparsity_config", json::object()}};
}

bool quantizable_linear(const std::string& param) {
  // A decoder layer's Linears under the Hub's names, as GPTQ / AWQ / compressed-tensors checkpoints hold them:
  // attention's q/k/v/o, Phi-3's fused qkv_proj, DeepSeek MLA's q_a/q_b/kv_a_proj_with_mqa/kv_b; the dense MLP's
  // gate/up/down and Phi-3's fused gate_up_proj; MoE experts under their per-expert names (Qwen3-MoE / DeepSeek's
  // mlp.experts.E, Mixtral's block_sparse_moe.experts.E) and DeepSeek's shared experts. Routers stay unquantized.
  static const std::regex linear(
      R"(model\.layers\.\d+\.(self_attn\.([qkvo]|qkv|q_a|q_b|kv_b)_proj|self_attn\.kv_a_proj_with_mqa|)"
      R"(mlp\.(experts\.\d+\.|shared_experts\.)?(gate|up|down|gate_up)_proj|)"
      R"(block_sparse_moe\.experts\.\d+\.w[123])\.weight)");
  return std::regex_match(param, linear);
}

std::vector<std::pair<std::string, Tensor>> quantize_linear(const QuantizeOptions& o, const std::string& module,
                                                            const Tensor& w, DType scale_dtype) {
  check_quantize_options(o);
  TP_CHECK(w.dim() == 2 && w.dtype() == DType::F32, "'{}.weight': f32 [out, in] expected, got {} {}", module,
           dtype_name(w.dtype()), shape_str(w.shape()));
  const int64_t N = w.size(0), K = w.size(1);
  const int pf = 32 / o.bits;
  TP_CHECK(o.group_size == -1 || K % o.group_size == 0,
           "'{}.weight' {}: in_features {} is not a multiple of --group-size {}", module, shape_str(w.shape()), K,
           o.group_size);
  const bool k_packed = o.format == "gptq", n_packed = o.format != "compressed-tensors";
  TP_CHECK(!k_packed || K % pf == 0, "'{}.weight' {}: in_features {} is not a multiple of {} ({} packs {} {}-bit values "
           "per int32 word along it)", module, shape_str(w.shape()), K, pf, o.format, pf, o.bits);
  TP_CHECK(!n_packed || N % pf == 0, "'{}.weight' {}: out_features {} is not a multiple of {} ({} packs {} {}-bit "
           "values per int32 word along it)", module, shape_str(w.shape()), N, pf, o.format, pf, o.bits);
  const DType sd = o.format == "compressed-tensors" ? scale_dtype : DType::F16;
  const Quantized q = round_to_nearest(o, module, w, sd);
  if (o.format == "gptq") return pack_gptq(o, module, q);
  if (o.format == "awq") return pack_awq(module, q);
  return pack_compressed_tensors(o, module, q, sd);
}

}  // namespace tp
