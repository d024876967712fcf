#include "tp/models/quantize_rtn.h"

#include <cmath>
#include <random>
#include <regex>

#include "tp/core/error.h"

namespace tp {

namespace {

// AutoAWQ's WQLinear_GEMM: bit slot i of a word holds column kAwqOrder[i] of its 8.
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// `s` rounded up to the nearest value of `d`: codes computed with the stored scale stay in range.
float stored_scale(float s, DType d, const std::string& module) {
  float r = s;
  if (d == DType::F16) {
    f16 h = to_f16(s);
    if (to_f32(h) < s) ++h.bits;
    r = to_f32(h);
  } else if (d == DType::BF16) {
    bf16 b = to_bf16(s);
    if (to_f32(b) < s) ++b.bits;
    r = to_f32(b);
  }
  TP_CHECK(std::isfinite(r) && r > 0, "'{}': a group scale of {} does not fit {} (weights this large cannot be "
           "stored in this format)", module, s, dtype_name(d));
  return r;
}

void store_scale(float s, DType d, void* dst, int64_t i) {
  if (d == DType::F16) static_cast<f16*>(dst)[i] = to_f16(s);
  else if (d == DType::BF16) static_cast<bf16*>(dst)[i] = to_bf16(s);
  else static_cast<float*>(dst)[i] = s;
}

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

struct Quantized {
  int64_t N, K, G;
  std::vector<uint8_t> codes;  // [N, K]
  std::vector<uint8_t> zeros;  // [N, G]
  std::vector<float> scales;   // [N, G], already values of the stored dtype
  std::vector<int32_t> grp;    // [K]
};

Quantized round_to_nearest(const QuantizeOptions& o, const std::string& module, const Tensor& w, DType scale_dtype) {
  Quantized q{w.size(0), w.size(1), 0, {}, {}, {}, feature_groups(o, module, w.size(1))};
  q.G = o.group_size == -1 ? 1 : q.K / o.group_size;
  const int maxq = (1 << o.bits) - 1, mid = 1 << (o.bits - 1);
  q.codes.resize(q.N * q.K);
  q.zeros.resize(q.N * q.G);
  q.scales.resize(q.N * q.G);
  const float* src = w.data<float>();
  std::vector<float> lo(q.G), hi(q.G);
  for (int64_t n = 0; n < q.N; ++n) {
    const float* row = src + n * q.K;
    std::fill(lo.begin(), lo.end(), 0.f);
    std::fill(hi.begin(), hi.end(), 0.f);
    for (int64_t k = 0; k < q.K; ++k) {
      TP_CHECK(std::isfinite(row[k]), "'{}.weight' holds {} at [{}, {}]; only finite weights can be quantized",
               module, row[k], n, k);
      lo[q.grp[k]] = std::min(lo[q.grp[k]], row[k]);
      hi[q.grp[k]] = std::max(hi[q.grp[k]], row[k]);
    }
    for (int64_t g = 0; g < q.G; ++g) {
      float s;
      int z;
      if (o.sym) {
        const float absmax = std::max(-lo[g], hi[g]);
        s = stored_scale(absmax > 0 ? absmax / static_cast<float>(mid - 1) : 1.f, scale_dtype, module);
        z = mid;
      } else {
        s = stored_scale(hi[g] > lo[g] ? (hi[g] - lo[g]) / static_cast<float>(maxq) : 1.f, scale_dtype, module);
        z = static_cast<int>(std::nearbyint(-lo[g] / s));
        // GPTQ v1 stores z - 1, and the kernels that read v1 add the 1 back without wrapping: a stored -1 would
        // be read as 2^bits. A group without negative weights therefore gets z = 1 and the range [0, max] over
        // the codes 1 .. 2^bits - 1.
        if (o.format == "gptq" && o.checkpoint_format == "gptq" && z == 0) {
          s = stored_scale(hi[g] > 0 ? hi[g] / static_cast<float>(maxq - 1) : 1.f, scale_dtype, module);
          z = 1;
        }
        z = std::clamp(z, 0, maxq);
      }
      q.scales[n * q.G + g] = s;
      q.zeros[n * q.G + g] = static_cast<uint8_t>(z);
    }
    for (int64_t k = 0; k < q.K; ++k) {
      const int64_t at = n * q.G + q.grp[k];
      const float v = std::nearbyint(row[k] / q.scales[at]) + static_cast<float>(q.zeros[at]);
      q.codes[n * q.K + k] = static_cast<uint8_t>(std::clamp(v, 0.f, static_cast<float>(maxq)));
    }
  }
  return q;
}

// value's bits at slot `slot` of word `i` (words zero-initialised).
void put(int32_t* words, int64_t i, int slot, int bits, uint32_t value) {
  words[i] = static_cast<int32_t>(static_cast<uint32_t>(words[i]) | (value << (bits * slot)));
}

Tensor scales_tensor(const Quantized& q, DType d, bool transposed) {
  Tensor t = Tensor::empty(transposed ? Shape{q.G, q.N} : Shape{q.N, q.G}, d);
  for (int64_t n = 0; n < q.N; ++n)
    for (int64_t g = 0; g < q.G; ++g) store_scale(q.scales[n * q.G + g], d, t.raw_data(), transposed ? g * q.N + n : n * q.G + g);
  return t;
}

std::vector<std::pair<std::string, Tensor>> pack_gptq(const QuantizeOptions& o, const std::string& m, const Quantized& q) {
  const int pf = 32 / o.bits, minus = o.checkpoint_format == "gptq" ? 1 : 0;
  Tensor qweight = Tensor::zeros({q.K / pf, q.N}, DType::I32), qzeros = Tensor::zeros({q.G, q.N / pf}, DType::I32);
  int32_t* qw = qweight.data<int32_t>();
  int32_t* qz = qzeros.data<int32_t>();
  for (int64_t n = 0; n < q.N; ++n) {
    for (int64_t k = 0; k < q.K; ++k) put(qw, (k / pf) * q.N + n, static_cast<int>(k % pf), o.bits, q.codes[n * q.K + k]);
    for (int64_t g = 0; g < q.G; ++g)
      put(qz, g * (q.N / pf) + n / pf, static_cast<int>(n % pf), o.bits, q.zeros[n * q.G + g] - minus);
  }
  Tensor g_idx = Tensor::empty({q.K}, DType::I32);
  std::copy(q.grp.begin(), q.grp.end(), g_idx.data<int32_t>());
  return {{m + ".qweight", qweight}, {m + ".qzeros", qzeros}, {m + ".scales", scales_tensor(q, DType::F16, true)},
          {m + ".g_idx", g_idx}};
}

std::vector<std::pair<std::string, Tensor>> pack_awq(const std::string& m, const Quantized& q) {
  const int64_t words = q.N / 8;
  Tensor qweight = Tensor::zeros({q.K, words}, DType::I32), qzeros = Tensor::zeros({q.G, words}, DType::I32);
  int32_t* qw = qweight.data<int32_t>();
  int32_t* qz = qzeros.data<int32_t>();
  for (int64_t c = 0; c < words; ++c)
    for (int slot = 0; slot < 8; ++slot) {
      const int64_t n = c * 8 + kAwqOrder[slot];
      for (int64_t k = 0; k < q.K; ++k) put(qw, k * words + c, slot, 4, q.codes[n * q.K + k]);
      for (int64_t g = 0; g < q.G; ++g) put(qz, g * words + c, slot, 4, q.zeros[n * q.G + g]);
    }
  return {{m + ".qweight", qweight}, {m + ".qzeros", qzeros}, {m + ".scales", scales_tensor(q, DType::F16, true)}};
}

std::vector<std::pair<std::string, Tensor>> pack_compressed_tensors(const QuantizeOptions& o, const std::string& m,
                                                                    const Quantized& q, DType scale_dtype) {
  const int pf = 32 / o.bits;
  const int64_t kw = (q.K + pf - 1) / pf;
  Tensor packed = Tensor::zeros({q.N, kw}, DType::I32);
  int32_t* p = packed.data<int32_t>();
  for (int64_t n = 0; n < q.N; ++n)
    for (int64_t k = 0; k < q.K; ++k) put(p, n * kw + k / pf, static_cast<int>(k % pf), o.bits, q.codes[n * q.K + k]);
  std::vector<std::pair<std::string, Tensor>> out = {{m + ".weight_packed", packed},
                                                     {m + ".weight_scale", scales_tensor(q, scale_dtype, false)}};
  if (!o.sym) {  // pack_to_int32 along dim 0 (out features), unsigned like the codes
    Tensor zp = Tensor::zeros({(q.N + pf - 1) / pf, q.G}, DType::I32);
    int32_t* z = zp.data<int32_t>();
    for (int64_t n = 0; n < q.N; ++n)
      for (int64_t g = 0; g < q.G; ++g) put(z, (n / pf) * q.G + g, static_cast<int>(n % pf), o.bits, q.zeros[n * q.G + g]);
    out.emplace_back(m + ".weight_zero_point", zp);
  }
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
  TP_CHECK(o.checkpoint_format == "gptq" || o.checkpoint_format == "gptq_v2",
           "--checkpoint-format {}: supported: gptq (v1), gptq_v2", o.checkpoint_format);
}

nlohmann::json quantization_config_json(const QuantizeOptions& o, const std::vector<std::string>& not_converted) {
  using nlohmann::json;
  if (o.format == "gptq")
    return {{"quant_method", "gptq"}, {"bits", o.bits}, {"group_size", o.group_size}, {"desc_act", o.desc_act},
            {"sym", o.sym}, {"lm_head", false}, {"checkpoint_format", o.checkpoint_format},
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
  // Attention, the dense MLP, and MoE experts under the Hub's per-expert names (Qwen3-MoE / DeepSeek's mlp.experts.E,
  // Mixtral's block_sparse_moe.experts.E), as GPTQ / AWQ / compressed-tensors checkpoints of MoE models hold them.
  static const std::regex linear(
      R"(model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(experts\.\d+\.)?(gate|up|down)_proj|)"
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
