#include "tp/models/quantized_checkpoint.h"

#include "tp/io/quantized_words.h"
#include "tp/models/quantized_shapes.h"
#include "tp/ops/quantized_linear.h"

namespace tp {

namespace {

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

// One quantized Linear being read: its config, names, global and local extents.
struct Reader {
  const Checkpoint& ckpt;
  const QuantizationConfig& q;
  std::string module;
  int64_t N, K, G;
  int pf;
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

  io::Source source(const std::string& name) const { return {ckpt.info(name).file.string(), name}; }

  // scales stored [groups, n] (GPTQ, AWQ: transposed) or [n, groups] (compressed-tensors), as f32 [n, groups].
  Tensor scales(const std::string& name, bool transposed) const {
    const int64_t n_dim = transposed ? 1 : 0, g_dim = 1 - n_dim;
    Tensor s = dim == 0 ? read(name, n_dim, n_spans, DType::F32) : read(name, g_dim, group_spans(), DType::F32);
    return io::scale_rows(s, transposed, source(name));
  }

  // Zero points packed along N; `n_rows` says whether N is the stored tensor's dim 0 (compressed-tensors)
  // or dim 1 (GPTQ, AWQ, whose words hold them in its interleaved order).
  Tensor zeros(const std::string& name, bool n_rows, int add, bool awq_order) const {
    const int64_t n_dim = n_rows ? 0 : 1;
    Tensor w = dim == 0 ? read(name, n_dim, in_units(n_spans, pf)) : read(name, 1 - n_dim, group_spans());
    const io::WordLayout layout{q.bits, 0, !n_rows, awq_order};
    return io::unpack_zero_points(w, layout, n, add, q.sym, source(name));
  }

  // Codes packed along K (GPTQ: words [K/pf, N]; compressed-tensors: [N, K/pf]).
  Tensor codes_packed_along_k(const std::string& name, bool n_rows) const {
    const int64_t n_dim = n_rows ? 0 : 1;
    Tensor w = dim == 0 ? read(name, n_dim, n_spans) : dim == 1 ? read(name, 1 - n_dim, in_units(k_spans, pf))
                                                                : ckpt.read(name);
    return io::unpack_words(w, {q.bits, 1, !n_rows, false}, n, k);
  }

  // AWQ's codes: words [K, N/8] packed along N in its interleaved order.
  Tensor awq_codes(const std::string& name) const {
    Tensor w = dim == 0 ? read(name, 1, in_units(n_spans, pf)) : dim == 1 ? read(name, 0, k_spans) : ckpt.read(name);
    return io::unpack_words(w, {4, 0, true, true}, n, k);
  }

  // GPTQ's g_idx for this rank's k: under act-order the groups of its rows (global group indices), else
  // checked to be k / group_size (a permuted g_idx with desc_act false would be read as garbage) and dropped.
  Tensor g_idx() const {
    const std::string name = key(".g_idx");
    if (!ckpt.has(name)) return {};
    Tensor g = dim == 1 ? read(name, 0, k_spans) : ckpt.read(name);
    Tensor out = io::group_index(g, dim == 1 ? k_spans : std::vector<ChunkSpan>{{0, K}}, K, G, q.group_size,
                                 q.desc_act, source(name));
    return q.desc_act ? out : Tensor();
  }

  QuantizedSlice read_all() const {
    QuantizedSlice s;
    s.bits = q.bits;
    if (q.method == "gptq") {
      s.codes = codes_packed_along_k(key(".qweight"), false);
      s.scales = scales(key(".scales"), true);
      s.zeros = zeros(key(".qzeros"), false, q.zeros_minus_one() ? 1 : 0, false);
      s.g_idx = g_idx();
      TP_CHECK(!q.desc_act || s.g_idx.defined(), "{}: act-order GPTQ (desc_act true) needs tensor '{}', which is "
               "missing", ckpt.dir().string(), key(".g_idx"));
    } else if (q.method == "awq") {
      s.codes = awq_codes(key(".qweight"));
      s.scales = scales(key(".scales"), true);
      s.zeros = zeros(key(".qzeros"), false, 0, true);
    } else {
      check_weight_shape();
      s.codes = codes_packed_along_k(key(".weight_packed"), true);
      s.scales = scales(key(".weight_scale"), false);
      if (q.sym) {
        s.zeros = Tensor::full({n, s.scales.size(1)}, 1 << (q.bits - 1), DType::U8);
      } else {
        s.zeros = zeros(key(".weight_zero_point"), true, 0, false);
      }
    }
    s.group_size = s.g_idx.defined() ? q.group_size : G == 1 ? k : q.group_size;
    return s;
  }

  void check_weight_shape() const {
    const std::string name = key(".weight_shape");
    if (!ckpt.has(name)) return;
    const std::vector<int64_t> v = io::stored_ints(ckpt.read(name));
    TP_CHECK(v.size() == 2, "{}: tensor '{}' holds {} values; the weight's shape is two", ckpt.info(name).file.string(),
             name, v.size());
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
  Reader r{ckpt, q, module, N, K, groups_of(q, K), q.pack_factor(), d,
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

Tensor dequantize(const QuantizedSlice& s) { return io::dequantize_codes(s.codes, s.scales, s.zeros, s.g_idx, s.group_size); }

}  // namespace tp
