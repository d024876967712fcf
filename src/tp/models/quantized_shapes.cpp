#include "tp/models/quantized_shapes.h"

#include "tp/core/error.h"

namespace tp {

namespace {

const std::vector<DType> kWords = {DType::I32};
const std::vector<DType> kFloats = {DType::F16, DType::BF16, DType::F32};

int64_t groups_of(const QuantizationConfig& q, int64_t k) {
  return q.group_size == -1 ? 1 : (k + q.group_size - 1) / q.group_size;
}

void check_packs(const std::string& module, const char* what, int64_t size, int pf, const QuantizationConfig& q) {
  TP_CHECK(size % pf == 0, "'{}': {} is {}, not a multiple of {} ({} packs {} {}-bit values per int32 word along it)",
           module, what, size, pf, q.method, pf, q.bits);
}

std::string dtypes_str(const std::vector<DType>& ds) {
  std::string s;
  for (DType d : ds) s += (s.empty() ? "" : " or ") + std::string(io::safetensors_dtype_name(d));
  return s;
}

}  // namespace

std::string packed_weight_name(const QuantizationConfig& q, const std::string& module) {
  return module + (q.method == "compressed-tensors" ? ".weight_packed" : ".qweight");
}

std::vector<PackedTensorSpec> packed_tensor_specs(const QuantizationConfig& q, const std::string& module,
                                                  const Shape& w) {
  TP_CHECK(q.packs_linears(), "'{}': quantization method {} does not store Linear weights packed", module, q.method);
  TP_CHECK(w.size() == 2 && w[0] > 0 && w[1] > 0, "'{}': a quantized Linear weight is 2-D [out, in], got {}", module,
           shape_str(w));
  const int64_t N = w[0], K = w[1], G = groups_of(q, K);
  const int pf = q.pack_factor();
  if (q.method == "gptq") {
    check_packs(module, "in_features (qweight's packed dim)", K, pf, q);
    check_packs(module, "out_features (qzeros' packed dim)", N, pf, q);
    return {{module + ".qweight", {K / pf, N}, kWords},
            {module + ".qzeros", {G, N / pf}, kWords},
            {module + ".scales", {G, N}, kFloats},
            {module + ".g_idx", {K}, kWords, q.desc_act}};
  }
  if (q.method == "awq") {
    check_packs(module, "out_features (qweight's packed dim)", N, pf, q);
    return {{module + ".qweight", {K, N / pf}, kWords},
            {module + ".qzeros", {G, N / pf}, kWords},
            {module + ".scales", {G, N}, kFloats}};
  }
  std::vector<PackedTensorSpec> specs = {{module + ".weight_packed", {N, (K + pf - 1) / pf}, kWords},
                                         {module + ".weight_scale", {N, G}, kFloats},
                                         {module + ".weight_shape", {2}, {DType::I64, DType::I32}, false}};
  if (!q.sym) specs.push_back({module + ".weight_zero_point", {(N + pf - 1) / pf, G}, kWords});
  return specs;
}

void check_packed_tensors(const QuantizationConfig& q, const std::string& module, const Shape& w,
                          const TensorFinder& find, const std::string& config_file, const std::string& dir) {
  const std::string implied = fmt::format("{}'s quantization_config ({} {}-bit, group_size {}{}) and '{}.weight' {}",
                                          config_file, q.method, q.bits, q.group_size, q.sym ? ", sym" : "", module,
                                          shape_str(w));
  for (const PackedTensorSpec& s : packed_tensor_specs(q, module, w)) {
    const io::TensorInfo* t = find(s.name);
    if (!t) {
      TP_CHECK(!s.required, "{}: tensor '{}' {} is missing: {} imply it", dir, s.name, shape_str(s.shape), implied);
      continue;
    }
    TP_CHECK(t->shape == s.shape, "{}: tensor '{}' has shape {}, but {} imply {}", t->file.string(), s.name,
             shape_str(t->shape), implied, shape_str(s.shape));
    bool dtype_ok = false;
    for (DType d : s.dtypes) dtype_ok = dtype_ok || t->dtype == d;
    TP_CHECK(dtype_ok, "{}: tensor '{}' has dtype {}; {} stores it as {}", t->file.string(), s.name,
             io::safetensors_dtype_name(t->dtype), q.method, dtypes_str(s.dtypes));
  }
}

}  // namespace tp
