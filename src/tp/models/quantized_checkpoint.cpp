#include "tp/models/quantized_checkpoint.h"

#include <cmath>
#include <cstring>

#include "tp/models/quantized_shapes.h"
#include "tp/ops/quantized_linear.h"

namespace tp {

namespace {

// AutoAWQ's WQLinear_GEMM puts column order[i] of each 8 at bit slot i, order = 0 2 4 6 1 3 5 7;
// column j therefore sits at slot kAwqSlot[j].
constexpr int kAwqSlot[8] = {0, 4, 1, 5, 2, 6, 3, 7};

std::string module_of(const std::string& param) { return param.substr(0, param.size() - std::string(".weight").size()); }

int64_t total(const std::vector<ChunkSpan>& spans) {
  int64_t n = 0;
  for (const ChunkSpan& s : spans) n += s.size;
  return n;
}

// The spans in units of `unit` elements (packed words, groups); callers checked the alignment first.
std::vector<ChunkSpan> in_units(const std::vector<ChunkSpan>& spans, int64_t unit) {
  std::vector<ChunkSpan> out;
  for (const ChunkSpan& s : spans) out.push_back({s.offset / unit, (s.offset + s.size + unit - 1) / unit - s.offset / unit});
  return out;
}

int64_t groups_of(const QuantizationConfig& q, int64_t k) {
  return q.group_size == -1 ? 1 : (k + q.group_size - 1) / q.group_size;
}

// A little-endian int32 word of a (possibly unaligned: a view of the file's mapping) tensor.
uint32_t word(const Tensor& t, int64_t i) {
  uint32_t w;
  std::memcpy(&w, static_cast<const char*>(t.raw_data()) + i * 4, 4);
  return w;
}

// One quantized Linear being read: its config, names, global and local extents.
struct Reader {
  const Checkpoint& ckpt;
  const QuantizationConfig& q;
  std::string module;
  int64_t N, K, G;
  int pf, mask;
  int dim;  // -1 replicated, 0 out split, 1 in split
  std::vector<ChunkSpan> n_spans, k_spans;
  int64_t n, k;

  std::string key(const char* suffix) const { return module + suffix; }
  // The groups this rank reads: those of its k spans under a grouped row split, else all of them.
  bool groups_split() const { return dim == 1 && G > 1 && !(q.method == "gptq" && q.desc_act); }
  std::vector<ChunkSpan> group_spans() const {
    return groups_split() ? in_units(k_spans, q.group_size) : std::vector<ChunkSpan>{{0, G}};
  }
  Tensor read(const std::string& name, int64_t along, const std::vector<ChunkSpan>& spans,
              std::optional<DType> as = {}) const {
    return ckpt.read_slice(name, along, spans, as);
  }

  // scales stored [groups, n] (GPTQ, AWQ: transposed) or [n, groups] (compressed-tensors), as f32 [n, groups].
  Tensor scales(const std::string& name, bool transposed) const {
    const int64_t n_dim = transposed ? 1 : 0, g_dim = 1 - n_dim;
    Tensor s = dim == 0 ? read(name, n_dim, n_spans, DType::F32) : read(name, g_dim, group_spans(), DType::F32);
    const int64_t rows = s.size(0), cols = s.size(1);
    const float* src = s.data<float>();
    for (int64_t i = 0; i < rows * cols; ++i)
      TP_CHECK(std::isfinite(src[i]), "{}: tensor '{}' holds {} at [{}, {}] (of the rows and columns this rank "
               "reads); scales must be finite", ckpt.info(name).file.string(), name, src[i], i / cols, i % cols);
    if (!transposed) return s;
    Tensor out = Tensor::empty({cols, rows});
    float* dst = out.data<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
    return out;
  }

  // Zero points packed along N; `n_rows` says whether N is the stored tensor's dim 0 (compressed-tensors)
  // or dim 1 (GPTQ, AWQ). `slot` maps a column's index within its word to its bit slot.
  Tensor zeros(const std::string& name, bool n_rows, int add, const int* slot) const {
    const int64_t n_dim = n_rows ? 0 : 1;
    Tensor w = dim == 0 ? read(name, n_dim, in_units(n_spans, pf)) : read(name, 1 - n_dim, group_spans());
    const int64_t groups = w.size(1 - n_dim), words = w.size(n_dim);
    Tensor out = Tensor::empty({n, groups}, DType::U8);
    uint8_t* z = out.data<uint8_t>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = n_rows ? (r / pf) * groups + g : g * words + r / pf;
        const int s = slot ? slot[r % pf] : static_cast<int>(r % pf);
        const int v = static_cast<int>((word(w, at) >> (q.bits * s)) & mask) + add;
        TP_CHECK(v <= 255, "{}: tensor '{}' stores {} (zero point minus one, checkpoint_format \"gptq\") for group "
                 "{} of row {}: zero point {} does not fit {} bits", ckpt.info(name).file.string(), name, v - add, g,
                 r, v, q.bits);
        if (q.sym)
          TP_CHECK(v == 1 << (q.bits - 1), "{}: tensor '{}' gives zero point {} for group {} of row {}, but "
                   "quantization_config says sym (zero point {})", ckpt.info(name).file.string(), name, v, g, r,
                   1 << (q.bits - 1));
        z[r * groups + g] = static_cast<uint8_t>(v);
      }
    return out;
  }

  // Codes packed along K (GPTQ: words [K/pf, N]; compressed-tensors: [N, K/pf]).
  Tensor codes_packed_along_k(const std::string& name, bool n_rows) const {
    const int64_t n_dim = n_rows ? 0 : 1;
    Tensor w = dim == 0 ? read(name, n_dim, n_spans) : dim == 1 ? read(name, 1 - n_dim, in_units(k_spans, pf))
                                                                : ckpt.read(name);
    const int64_t words = w.size(1 - n_dim);
    Tensor out = Tensor::empty({n, k}, DType::U8);
    uint8_t* c = out.data<uint8_t>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i) {
        const int64_t at = n_rows ? r * words + i / pf : (i / pf) * n + r;
        c[r * k + i] = static_cast<uint8_t>((word(w, at) >> (q.bits * (i % pf))) & mask);
      }
    return out;
  }

  // AWQ's codes: words [K, N/8] packed along N in its interleaved order.
  Tensor awq_codes(const std::string& name) const {
    Tensor w = dim == 0 ? read(name, 1, in_units(n_spans, pf)) : dim == 1 ? read(name, 0, k_spans) : ckpt.read(name);
    const int64_t words = w.size(1);
    Tensor out = Tensor::empty({n, k}, DType::U8);
    uint8_t* c = out.data<uint8_t>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i)
        c[r * k + i] = static_cast<uint8_t>((word(w, i * words + r / pf) >> (4 * kAwqSlot[r % pf])) & mask);
    return out;
  }

  // GPTQ's g_idx for this rank's k: under act-order the groups of its rows (global group indices), else
  // checked to be k / group_size (a permuted g_idx with desc_act false would be read as garbage) and dropped.
  Tensor g_idx() const {
    const std::string name = key(".g_idx");
    if (!ckpt.has(name)) return {};
    Tensor g = dim == 1 ? read(name, 0, k_spans) : ckpt.read(name);
    Tensor out = Tensor::empty({k}, DType::I32);
    int32_t* dst = out.data<int32_t>();
    int64_t i = 0;
    for (const ChunkSpan& s : dim == 1 ? k_spans : std::vector<ChunkSpan>{{0, K}})
      for (int64_t kk = s.offset; kk < s.offset + s.size; ++kk, ++i) {
        const auto v = static_cast<int32_t>(word(g, i));
        TP_CHECK(v >= 0 && v < G, "{}: tensor '{}' holds {} at [{}]; group indices must lie in [0, {}) ({} groups "
                 "of {} over in_features {})", ckpt.info(name).file.string(), name, v, kk, G, G, q.group_size, K);
        const int64_t natural = q.group_size == -1 ? 0 : kk / q.group_size;
        TP_CHECK(q.desc_act || v == natural, "{}: tensor '{}' holds {} at [{}] where k / group_size is {}, but "
                 "quantization_config says desc_act false; an act-order checkpoint says \"desc_act\": true",
                 ckpt.info(name).file.string(), name, v, kk, natural);
        dst[i] = v;
      }
    return q.desc_act ? out : Tensor();
  }

  QuantizedSlice read_all() const {
    QuantizedSlice s;
    s.bits = q.bits;
    if (q.method == "gptq") {
      s.codes = codes_packed_along_k(key(".qweight"), false);
      s.scales = scales(key(".scales"), true);
      s.zeros = zeros(key(".qzeros"), false, q.zeros_minus_one() ? 1 : 0, nullptr);
      s.g_idx = g_idx();
      TP_CHECK(!q.desc_act || s.g_idx.defined(), "{}: act-order GPTQ (desc_act true) needs tensor '{}', which is "
               "missing", ckpt.dir().string(), key(".g_idx"));
    } else if (q.method == "awq") {
      s.codes = awq_codes(key(".qweight"));
      s.scales = scales(key(".scales"), true);
      s.zeros = zeros(key(".qzeros"), false, 0, kAwqSlot);
    } else {
      check_weight_shape();
      s.codes = codes_packed_along_k(key(".weight_packed"), true);
      s.scales = scales(key(".weight_scale"), false);
      if (q.sym) {
        s.zeros = Tensor::empty({n, s.scales.size(1)}, DType::U8);
        std::memset(s.zeros.raw_data(), 1 << (q.bits - 1), s.zeros.nbytes());
      } else {
        s.zeros = zeros(key(".weight_zero_point"), true, 0, nullptr);
      }
    }
    s.group_size = s.g_idx.defined() ? q.group_size : G == 1 ? k : q.group_size;
    return s;
  }

  void check_weight_shape() const {
    const std::string name = key(".weight_shape");
    if (!ckpt.has(name)) return;
    const Tensor t = ckpt.read(name);
    int64_t v[2];
    for (int i = 0; i < 2; ++i)
      v[i] = t.dtype() == DType::I64 ? t.data<int64_t>()[i] : static_cast<int32_t>(word(t, i));
    TP_CHECK(v[0] == N && v[1] == K, "{}: tensor '{}' holds [{}, {}], but config.json implies the weight [{}, {}]",
             ckpt.info(name).file.string(), name, v[0], v[1], N, K);
  }
};

const QuantizationConfig& packed_config(const Checkpoint& ckpt, const std::string& param) {
  const std::optional<QuantizationConfig>& q = ckpt.config().quantization;
  TP_CHECK(q && q->packs_linears(), "{}: '{}' is stored quantized, but config.json has no quantization_config "
           "(gptq, awq or compressed-tensors) saying how", ckpt.dir().string(), param);
  return *q;
}

std::string tp_size(int64_t global, int64_t local) {
  return local > 0 && global % local == 0 ? fmt::format("tp size {} ({} / {})", global / local, global, local)
                                          : fmt::format("{} / {} per rank", global, local);
}

}  // namespace

bool reads_quantized(const Checkpoint& ckpt, const std::string& param) {
  if (!param.ends_with(".weight") || ckpt.has(param)) return false;
  const std::string module = module_of(param);
  return ckpt.has(module + ".qweight") || ckpt.has(module + ".weight_packed");
}

void check_quantized_shard(const QuantizationConfig& q, const std::string& param, const Shape& shape,
                           const nn::ParamShard& shard) {
  TP_CHECK(shape.size() == 2, "'{}': a quantized Linear weight is 2-D [out, in], got {}", param, shape_str(shape));
  if (shard.replicated()) return;
  TP_CHECK(shard.dim == 0 || shard.dim == 1, "'{}': a quantized Linear is split along out (dim 0) or in (dim 1), "
           "not dim {}", param, shard.dim);
  const int64_t size = shape[shard.dim], local = total(shard.spans), pf = q.pack_factor();
  const bool along_k = shard.dim == 1;
  // Where the split dim is packed into words, each span must hold whole words.
  const bool packed = along_k ? q.method != "awq" : q.method != "compressed-tensors" || !q.sym;
  const bool grouped = along_k && groups_of(q, size) > 1 && !(q.method == "gptq" && q.desc_act);
  for (const ChunkSpan& s : shard.spans) {
    auto cuts = [&](int64_t unit) { return s.offset % unit != 0 || (s.size % unit != 0 && s.offset + s.size != size); };
    TP_CHECK(!grouped || !cuts(q.group_size),
             "'{}': the input size is not aligned with the quantized weight shape: in_features {} under {} gives "
             "the shard [{}, {}), which cuts a group of group_size {} ({} {}-bit); this can be caused by too large "
             "a tensor parallel size: each rank must hold whole groups",
             param, size, tp_size(size, local), s.offset, s.offset + s.size, q.group_size, q.method, q.bits);
    TP_CHECK(!packed || !cuts(pf),
             "'{}': the {} size is not aligned with the quantized weight shape: {} {} under {} gives the shard "
             "[{}, {}), which cuts a packed int32 word of {} {}-bit values ({}); this can be caused by too large a "
             "tensor parallel size",
             param, along_k ? "input" : "output", along_k ? "in_features" : "out_features", size,
             tp_size(size, local), s.offset, s.offset + s.size, pf, q.bits, q.method);
  }
}

void check_quantized_shards(const Checkpoint& ckpt, const std::vector<nn::Parameter*>& params) {
  for (const nn::Parameter* p : params)
    if (reads_quantized(ckpt, p->name))
      check_quantized_shard(packed_config(ckpt, p->name), p->name, p->global_shape, p->shard);
}

QuantizedSlice read_quantized(const Checkpoint& ckpt, const std::string& param, const Shape& shape,
                              const nn::ParamShard& shard) {
  const QuantizationConfig& q = packed_config(ckpt, param);
  check_quantized_shard(q, param, shape, shard);
  const std::string module = module_of(param);
  check_packed_tensors(q, module, shape, [&](const std::string& n) { return ckpt.has(n) ? &ckpt.info(n) : nullptr; },
                       (ckpt.dir() / "config.json").string(), ckpt.dir().string());
  const int64_t N = shape[0], K = shape[1];
  const int d = shard.replicated() ? -1 : static_cast<int>(shard.dim);
  Reader r{ckpt, q, module, N, K, groups_of(q, K), q.pack_factor(), (1 << q.bits) - 1, d,
           d == 0 ? shard.spans : std::vector<ChunkSpan>{{0, N}}, d == 1 ? shard.spans : std::vector<ChunkSpan>{{0, K}},
           0, 0};
  r.n = total(r.n_spans);
  r.k = total(r.k_spans);
  return r.read_all();
}

int64_t quantized_slice_bytes(const QuantizationConfig& q, const Shape& global, const Shape& local) {
  const int64_t n = local[0], k = local[1];
  const bool act = q.method == "gptq" && q.desc_act;
  return static_cast<int64_t>(ops::QuantizedLinear::resident_bytes(q.bits, n, k, groups_of(q, act ? global[1] : k), act));
}

Tensor dequantize(const QuantizedSlice& s) {
  TP_CHECK(s.codes.dim() == 2 && s.codes.dtype() == DType::U8 && s.scales.dtype() == DType::F32 &&
               s.zeros.dtype() == DType::U8 && s.scales.dim() == 2 && s.zeros.shape() == s.scales.shape() &&
               s.scales.size(0) == s.codes.size(0),
           "dequantize: codes u8 [n, k], scales f32 and zeros u8 [n, groups] expected, got {} {}, {} {}, {} {}",
           dtype_name(s.codes.dtype()), shape_str(s.codes.shape()), dtype_name(s.scales.dtype()),
           shape_str(s.scales.shape()), dtype_name(s.zeros.dtype()), shape_str(s.zeros.shape()));
  const int64_t n = s.codes.size(0), k = s.codes.size(1), groups = s.scales.size(1);
  TP_CHECK(s.g_idx.defined() || s.group_size > 0, "dequantize: group_size {} without g_idx", s.group_size);
  const uint8_t* c = s.codes.data<uint8_t>();
  const uint8_t* z = s.zeros.data<uint8_t>();
  const float* sc = s.scales.data<float>();
  const int32_t* gi = s.g_idx.defined() ? s.g_idx.data<int32_t>() : nullptr;
  Tensor out = Tensor::empty({n, k});
  float* o = out.data<float>();
  for (int64_t i = 0; i < k; ++i) {
    const int64_t g = gi ? gi[i] : i / s.group_size;
    TP_CHECK(g >= 0 && g < groups, "dequantize: column {} is in group {}, outside the {} held", i, g, groups);
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t g = gi ? gi[i] : i / s.group_size;
      o[r * k + i] = sc[r * groups + g] * static_cast<float>(static_cast<int>(c[r * k + i]) - z[r * groups + g]);
    }
  return out;
}

}  // namespace tp
