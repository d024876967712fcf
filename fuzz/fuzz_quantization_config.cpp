// libFuzzer target for config.json's quantization_config and the packed-tensor shape checks. An input is
//   {"quantization_config": {...}, "weight_shape": [N, K], "tensors": {"L.qweight": {"dtype": "I32", "shape": [..]}}}
// (the last two optional): any text ends in a config or a tp::Error, never a crash or another exception; an
// accepted config's module matching runs on a few names; when the tensors pass check_packed_tensors, every
// required tensor of the format is there with the shape and a dtype the format implies.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "tp/models/quantized_shapes.h"
#include "tp/core/error.h"

namespace {

// Sizes beyond any model's, refused before they reach the shape arithmetic (config.json bounds them alike).
constexpr int64_t kMaxSize = int64_t{1} << 31;

tp::Shape shape_of(const nlohmann::json& j) {
  tp::Shape s;
  if (!j.is_array() || j.size() > 4) return s;
  for (const nlohmann::json& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > kMaxSize) return {};
    s.push_back(d.get<int64_t>());
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  if (!j.is_object()) return 0;
  std::optional<tp::QuantizationConfig> q;
  try {
    q = tp::parse_quantization_config(j, "fuzz/config.json");
  } catch (const tp::Error&) {
    return 0;
  }
  if (!q) return 0;
  try {  // a pattern that backtracks without bound is refused by name
    for (const char* m : {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.gate", "lm_head", ""})
      (void)q->quantizes(m);
  } catch (const tp::Error&) {
    return 0;
  }
  if (!q->packs_linears()) return 0;
  const tp::Shape w = shape_of(j.value("weight_shape", nlohmann::json()));
  if (w.size() != 2) return 0;
  std::map<std::string, tp::io::TensorInfo> index;
  if (auto t = j.find("tensors"); t != j.end() && t->is_object())
    for (auto it = t->begin(); it != t->end(); ++it) {
      if (!it.value().is_object() || !it.value().value("dtype", nlohmann::json()).is_string()) continue;
      tp::io::TensorInfo info;
      info.name = it.key();
      try {
        info.dtype = tp::parse_dtype(it.value()["dtype"].get<std::string>());
      } catch (const tp::Error&) {
        continue;
      }
      info.shape = shape_of(it.value().value("shape", nlohmann::json()));
      index[it.key()] = info;
    }
  auto find = [&](const std::string& n) -> const tp::io::TensorInfo* {
    auto it = index.find(n);
    return it == index.end() ? nullptr : &it->second;
  };
  try {
    tp::check_packed_tensors(*q, "L", w, find, "fuzz/config.json", "fuzz");
  } catch (const tp::Error&) {
    return 0;
  }
  for (const tp::PackedTensorSpec& s : tp::packed_tensor_specs(*q, "L", w)) {
    const tp::io::TensorInfo* t = find(s.name);
    if (!t) {
      if (s.required) std::abort();
      continue;
    }
    bool dtype_ok = false;
    for (tp::DType d : s.dtypes) dtype_ok = dtype_ok || d == t->dtype;
    if (t->shape != s.shape || !dtype_ok) std::abort();
  }
  return 0;
}
