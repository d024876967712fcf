// Quantized checkpoints written by `tp quantize` (make_quantized_models.sh, a fixture): read_quantized +
// dequantize equal the independent numpy reference's dequantization bit for bit (so a wrong nibble order, zero
// offset or transposition on either side fails); sharded reads at tp 2 and 4 equal the slices of the whole, or
// are refused exactly where a shard would cut a group or a packed word; and damaged checkpoints (missing or
// misshapen tensors, g_idx out of range, NaN scales, zero points against sym) are errors naming the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "ops/op_test_util.h"
#include "tp/io/json_file.h"
#include "tp/io/writer.h"
#include "tp/models/layout.h"
#include "tp/models/quantized_checkpoint.h"

using namespace tp;
using tp::test::expect_error;
namespace fs = std::filesystem;

namespace {

fs::path models_dir() {
  const char* d = std::getenv("TP_QUANT_MODELS");
  if (!d) throw Error("set TP_QUANT_MODELS to make_quantized_models.sh's output");
  return d;
}

std::vector<std::string> model_names() {
  std::ifstream in(models_dir() / "models.txt");
  std::vector<std::string> names;
  for (std::string n; std::getline(in, n);)
    if (!n.empty()) names.push_back(n);
  return names;
}

struct Linear {
  std::string name;
  Shape shape;
};

std::vector<Linear> quantized_linears(const Checkpoint& ckpt) {
  std::vector<Linear> out;
  for (const ParamSpec& p : checkpoint_layout(ckpt.config()))
    if (reads_quantized(ckpt, p.name)) out.push_back({p.name, p.shape});
  return out;
}

void expect_bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), DType::F32) << what;
  ASSERT_EQ(b.dtype(), DType::F32) << what;
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(&x[i], &y[i], 4) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << x[i] << ", expected " << y[i];
      return;
    }
}

// `full` [N, K] restricted to `spans` along `dim` (concatenated), as a shard reads it.
Tensor slice_of(const Tensor& full, int64_t dim, const std::vector<ChunkSpan>& spans) {
  std::vector<Tensor> parts;
  for (const ChunkSpan& s : spans) parts.push_back(full.narrow(dim, s.offset, s.size).clone());
  int64_t n = 0;
  for (const Tensor& p : parts) n += p.size(dim);
  Shape shape = full.shape();
  shape[dim] = n;
  Tensor out = Tensor::empty(shape);
  float* o = out.data<float>();
  const int64_t rows = shape[0], cols = shape[1];
  int64_t at = 0;
  for (const Tensor& p : parts) {
    for (int64_t r = 0; r < p.size(0); ++r)
      for (int64_t c = 0; c < p.size(1); ++c)
        o[dim == 0 ? (at + r) * cols + c : r * cols + at + c] = p.data<float>()[r * p.size(1) + c];
    at += p.size(dim);
  }
  (void)rows;
  return out;
}

nn::ParamShard shard(int64_t dim, std::vector<ChunkSpan> spans) {
  nn::ParamShard s;
  s.dim = dim;
  s.spans = std::move(spans);
  return s;
}

// The rule, stated independently of the reader: may `spans` along `dim` be read under `q`?
bool aligned(const QuantizationConfig& q, int64_t dim, const std::vector<ChunkSpan>& spans, const Shape& w) {
  const int64_t pf = 32 / q.bits;
  for (const ChunkSpan& s : spans) {
    if (dim == 1) {
      const bool one_group = q.group_size == -1;
      if (!one_group && !q.desc_act && (s.offset % q.group_size || s.size % q.group_size)) return false;
      if (q.method != "awq" && (s.offset % pf || s.size % pf)) return false;
    } else if (q.method != "compressed-tensors" || !q.sym) {
      if (s.offset % pf || s.size % pf) return false;
    }
  }
  (void)w;
  return true;
}

}  // namespace

TEST(QuantizedCheckpoint, ReadEqualsTheNumpyReferenceBitwise) {
  const std::vector<std::string> names = model_names();
  ASSERT_GE(names.size(), 17u);
  for (const std::string& name : names) {
    const Checkpoint ckpt = Checkpoint::open(models_dir() / name);
    const Checkpoint ref = Checkpoint::open(models_dir() / (name + ".deq"));
    ASSERT_TRUE(ckpt.config().quantization) << name;
    const std::vector<Linear> linears = quantized_linears(ckpt);
    ASSERT_EQ(linears.size(), 14u) << name;  // 2 layers x q k v o gate up down
    for (const Linear& l : linears) {
      const QuantizedSlice s = read_quantized(ckpt, l.name, l.shape, {});
      EXPECT_EQ(s.codes.shape(), l.shape) << name << " " << l.name;
      EXPECT_EQ(s.g_idx.defined(), ckpt.config().quantization->desc_act) << name << " " << l.name;
      expect_bitwise_equal(dequantize(s), ref.read(l.name, DType::F32), name + " " + l.name);
    }
  }
}

TEST(QuantizedCheckpoint, ShardedReadsAreSlicesOfTheWhole) {
  int refused = 0, read = 0, act_order_rows = 0;
  for (const std::string& name : model_names()) {
    const Checkpoint ckpt = Checkpoint::open(models_dir() / name);
    const QuantizationConfig& q = *ckpt.config().quantization;
    for (const Linear& l : quantized_linears(ckpt)) {
      const Tensor whole = dequantize(read_quantized(ckpt, l.name, l.shape, {}));
      for (int64_t dim : {0, 1})
        for (int64_t tp : {2, 4}) {
          const int64_t chunk = l.shape[dim] / tp;
          for (int64_t rank = 0; rank < tp; ++rank) {
            // One span per rank, and (at tp 2 along out) the two-span cut of a fused pair's halves.
            std::vector<std::vector<ChunkSpan>> cuts = {{{rank * chunk, chunk}}};
            if (tp == 2 && dim == 0) cuts.push_back({{rank * chunk / 2, chunk / 2}, {chunk + rank * chunk / 2, chunk / 2}});
            for (const std::vector<ChunkSpan>& spans : cuts) {
              const nn::ParamShard sh = shard(dim, spans);
              const std::string what = fmt::format("{} {} dim {} tp {} rank {} ({} spans)", name, l.name, dim, tp, rank,
                                                   spans.size());
              if (!aligned(q, dim, spans, l.shape)) {
                expect_error([&] { read_quantized(ckpt, l.name, l.shape, sh); }, {l.name, "not aligned"});
                ++refused;
                continue;
              }
              const QuantizedSlice s = read_quantized(ckpt, l.name, l.shape, sh);
              if (dim == 1 && q.desc_act) {
                ++act_order_rows;
                EXPECT_TRUE(s.g_idx.defined()) << what;
                EXPECT_EQ(s.scales.size(1), q.group_size == -1 ? 1 : l.shape[1] / q.group_size) << what;
              }
              expect_bitwise_equal(dequantize(s), slice_of(whole, dim, spans), what);
              ++read;
            }
          }
        }
    }
  }
  EXPECT_GT(read, 1000);
  EXPECT_GT(refused, 0);  // g128's o_proj (in 256) at tp 4 at least
  EXPECT_GT(act_order_rows, 0);
}

TEST(QuantizedCheckpoint, AGroupCuttingPlanIsRefusedBeforeReading) {
  const Checkpoint ckpt = Checkpoint::open(models_dir() / "gptq-v1-4b-g128-asym");
  nn::Parameter o{"model.layers.0.self_attn.o_proj.weight", {256, 256}, {}, shard(1, {{64, 64}})};
  nn::Parameter q{"model.layers.0.self_attn.q_proj.weight", {256, 256}, {}, shard(0, {{64, 64}})};
  check_quantized_shards(ckpt, {&q});  // a column split of whole words is fine
  expect_error([&] { check_quantized_shards(ckpt, {&q, &o}); },
               {"model.layers.0.self_attn.o_proj.weight", "input size is not aligned with the quantized weight shape",
                "in_features 256", "tp size 4 (256 / 64)", "group_size 128"});
  nn::Parameter k{"model.layers.0.self_attn.k_proj.weight", {128, 256}, {}, shard(0, {{4, 60}})};
  expect_error([&] { check_quantized_shards(Checkpoint::open(models_dir() / "awq-4b-g32"), {&k}); },
               {"model.layers.0.self_attn.k_proj.weight", "output size is not aligned", "out_features 128",
                "packed int32 word of 8 4-bit values"});
  // Act-order: scales stay whole, so a row split only needs whole words.
  check_quantized_shards(Checkpoint::open(models_dir() / "gptq-v1-4b-g128-asym-act"), {&o});
}

namespace {

// A copy of `from` with its tensors changed by `edit` (name -> tensor; erase to drop one) and its
// quantization_config by `edit_config`.
fs::path damaged(const std::string& from, const std::string& to,
                 const std::function<void(std::map<std::string, Tensor>&)>& edit,
                 const std::function<void(nlohmann::json&)>& edit_config = {}) {
  const fs::path src = models_dir() / from, dst = fs::path(::testing::TempDir()) / to;
  fs::remove_all(dst);
  fs::create_directories(dst);
  const io::TensorStore store = io::TensorStore::open(src);
  std::map<std::string, Tensor> tensors;
  for (const std::string& n : store.tensor_names()) tensors[n] = store.read(n).clone();
  edit(tensors);
  io::save_safetensors(dst / "model.safetensors", {tensors.begin(), tensors.end()});
  nlohmann::json config = io::read_json_file(src / "config.json");
  if (edit_config) edit_config(config);
  io::write_json_file(dst / "config.json", config);
  return dst;
}

const std::string kQ = "model.layers.0.self_attn.q_proj";

}  // namespace

TEST(QuantizedCheckpoint, DamagedCheckpointsNameTheTensor) {
  expect_error([] { Checkpoint::open(damaged("gptq-v1-4b-g128-asym", "no-qzeros", [](auto& t) { t.erase(kQ + ".qzeros"); })); },
               {kQ + ".qzeros", "is missing", "gptq 4-bit, group_size 128"});
  expect_error([] {
    Checkpoint::open(damaged("awq-4b-g32", "bad-shape", [](auto& t) { t[kQ + ".qweight"] = Tensor::zeros({256, 16}, DType::I32); }));
  }, {kQ + ".qweight", "has shape [256, 16]", "imply [256, 32]"});
  expect_error([] {
    Checkpoint::open(damaged("ct-4b-g32-asym", "bad-dtype", [](auto& t) { t[kQ + ".weight_packed"] = t[kQ + ".weight_packed"].to(DType::F32); }));
  }, {kQ + ".weight_packed", "has dtype F32", "I32"});
  expect_error([] {
    Checkpoint::open(damaged("gptq-v1-4b-g128-asym", "no-config", [](auto&) {},
                             [](nlohmann::json& c) { c.erase("quantization_config"); }));
  }, {"self_attn.q_proj.qweight", "has no quantization_config"});
  expect_error([] {
    Checkpoint::open(damaged("gptq-v1-4b-g128-asym", "bits-3", [](auto&) {},
                             [](nlohmann::json& c) { c["quantization_config"]["bits"] = 3; }));
  }, {"config.json: quantization_config", "'bits' is 3", "supported: 4, 8"});

  const fs::path g_idx = damaged("gptq-v1-4b-g128-asym-act", "g-idx-range",
                                 [](auto& t) { t[kQ + ".g_idx"].template data<int32_t>()[5] = 7; });
  expect_error([&] { read_quantized(Checkpoint::open(g_idx), kQ + ".weight", {256, 256}, {}); },
               {kQ + ".g_idx", "holds 7 at [5]", "[0, 2)"});
  const fs::path permuted = damaged("gptq-v1-4b-g128-asym", "g-idx-permuted",
                                    [](auto& t) { std::swap(t[kQ + ".g_idx"].template data<int32_t>()[0], t[kQ + ".g_idx"].template data<int32_t>()[200]); });
  expect_error([&] { read_quantized(Checkpoint::open(permuted), kQ + ".weight", {256, 256}, {}); },
               {kQ + ".g_idx", "holds 1 at [0]", "desc_act false"});
  const fs::path nan = damaged("gptq-v2-4b-g32-asym", "nan-scale",
                               [](auto& t) { t[kQ + ".scales"].template data<f16>()[3] = to_f16(NAN); });
  expect_error([&] { read_quantized(Checkpoint::open(nan), kQ + ".weight", {256, 256}, {}); },
               {kQ + ".scales", "holds nan at [0, 3]", "finite"});
  const fs::path inf = damaged("ct-4b-g128-sym", "inf-scale",
                               [](auto& t) { t[kQ + ".weight_scale"].template data<float>()[2] = INFINITY; });
  expect_error([&] { read_quantized(Checkpoint::open(inf), kQ + ".weight", {256, 256}, {}); },
               {kQ + ".weight_scale", "holds inf at [1, 0]"});
  const fs::path zero = damaged("gptq-v1-4b-g32-sym", "sym-zero",
                                [](auto& t) { t[kQ + ".qzeros"].template data<int32_t>()[0] ^= 1; });
  expect_error([&] { read_quantized(Checkpoint::open(zero), kQ + ".weight", {256, 256}, {}); },
               {kQ + ".qzeros", "zero point 7", "says sym"});
  const fs::path shape = damaged("ct-8b-g128-asym", "weight-shape",
                                 [](auto& t) { t[kQ + ".weight_shape"].template data<int64_t>()[1] = 255; });
  expect_error([&] { read_quantized(Checkpoint::open(shape), kQ + ".weight", {256, 256}, {}); },
               {kQ + ".weight_shape", "holds [256, 255]", "[256, 256]"});
}
