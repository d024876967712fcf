#include "tp/models/quantized_experts.h"

#include "tp/models/moe_hub_names.h"
#include "tp/models/quantized_checkpoint.h"

namespace tp {

namespace {

// One projection of the local experts: its Hub names' pieces, global shape and this rank's shard of it.
struct Projection {
  const char* proj;
  Shape shape;
  nn::ParamShard shard;
};

// This rank's experts and the shards of their three projections, from the fused parameters' shards.
struct Layout {
  std::string layer;
  const HubNaming* naming = nullptr;
  std::vector<int64_t> local;  // the global ids of this rank's experts
  Projection gate, up, down;
};

// The spans of [lo, lo + size) among `spans`, moved to start at 0.
std::vector<ChunkSpan> spans_within(const std::vector<ChunkSpan>& spans, int64_t lo, int64_t size) {
  std::vector<ChunkSpan> out;
  for (const ChunkSpan& s : spans) {
    const int64_t a = std::max(s.offset, lo), b = std::min(s.offset + s.size, lo + size);
    if (a < b) out.push_back({a - lo, b - a});
  }
  return out;
}

nn::ParamShard shard_of(int64_t dim, std::vector<ChunkSpan> spans, int64_t whole) {
  nn::ParamShard s;
  if (spans.size() == 1 && spans[0].offset == 0 && spans[0].size == whole) return s;  // all of it: replicated
  s.dim = dim;
  s.spans = std::move(spans);
  return s;
}

Layout layout_of(const Checkpoint& ckpt, const nn::MoeExperts& experts) {
  Layout l;
  TP_CHECK(!experts.layout().gpt_oss, "{}: GPT-OSS's experts are fused (MXFP4), not per-expert Linears",
           experts.name());
  l.layer = layer_prefix(experts.gate_up_proj.name);
  for (const HubNaming& n : kNamings)
    if (reads_quantized(ckpt, expert_key(l.layer, n, 0, n.gate))) l.naming = &n;
  const int64_t E = experts.num_experts(), I = experts.gate_up_proj.global_shape[1] / 2,
                H = experts.gate_up_proj.global_shape[2];
  const nn::ParamShard& gu = experts.gate_up_proj.shard;
  const nn::ParamShard& dn = experts.down_proj.shard;
  l.gate = {l.naming ? l.naming->gate : "", {I, H}, {}};
  l.up = {l.naming ? l.naming->up : "", {I, H}, {}};
  l.down = {l.naming ? l.naming->down : "", {H, I}, {}};
  for (int64_t e = 0; e < E; ++e) l.local.push_back(e);
  if (!gu.replicated() && gu.dim == 0) {  // expert parallelism: whole experts
    l.local.clear();
    for (const ChunkSpan& s : gu.spans)
      for (int64_t e = s.offset; e < s.offset + s.size; ++e) l.local.push_back(e);
  } else if (!gu.replicated()) {
    TP_CHECK(gu.dim == 1, "{}: a quantized expert's gate_up_proj is split by rows (dim 1) or experts (dim 0), not "
             "dim {}", experts.gate_up_proj.name, gu.dim);
    l.gate.shard = shard_of(0, spans_within(gu.spans, 0, I), I);
    l.up.shard = shard_of(0, spans_within(gu.spans, I, I), I);
  }
  if (!dn.replicated() && dn.dim != 0) {
    TP_CHECK(dn.dim == 2, "{}: a quantized expert's down_proj is split by its inputs (dim 2) or experts (dim 0), "
             "not dim {}", experts.down_proj.name, dn.dim);
    l.down.shard = shard_of(1, dn.spans, I);
  }
  return l;
}

std::string name_of(const Layout& l, int64_t e, const Projection& p) { return expert_key(l.layer, *l.naming, e, p.proj); }

}  // namespace

bool reads_quantized_experts(const Checkpoint& ckpt, const nn::MoeExperts& experts) {
  if (experts.layout().gpt_oss) return false;
  const std::string layer = layer_prefix(experts.gate_up_proj.name);
  for (const HubNaming& n : kNamings)
    if (reads_quantized(ckpt, expert_key(layer, n, 0, n.gate))) return true;
  return false;
}

void check_quantized_expert_shards(const Checkpoint& ckpt, const nn::MoeExperts& experts) {
  const Layout l = layout_of(ckpt, experts);
  const QuantizationConfig& q = *ckpt.config().quantization;
  for (int64_t e : l.local)
    for (const Projection* p : {&l.gate, &l.up, &l.down}) check_quantized_shard(q, name_of(l, e, *p), p->shape, p->shard);
}

QuantizedExperts read_quantized_experts(const Checkpoint& ckpt, const nn::MoeExperts& experts) {
  check_quantized_expert_shards(ckpt, experts);
  const Layout l = layout_of(ckpt, experts);
  QuantizedExperts out;
  for (int64_t e : l.local) {
    auto read = [&](const Projection& p) {
      const QuantizedSlice s = read_quantized(ckpt, name_of(l, e, p), p.shape, p.shard);
      return ops::QuantizedLinear(s.bits, s.group_size, s.codes, s.scales, s.zeros, s.g_idx);
    };
    out.gate.push_back(read(l.gate));
    out.up.push_back(read(l.up));
    out.down.push_back(read(l.down));
  }
  return out;
}

bool quantizes_experts(const QuantizationConfig& q, const HubNaming* naming, const nn::MoeExperts& experts) {
  if (!q.packs_linears() || naming == nullptr) return false;
  const std::string key = expert_key(layer_prefix(experts.gate_up_proj.name), *naming, 0, naming->gate);
  return q.quantizes(key.substr(0, key.size() - std::string(".weight").size()));
}

QuantizedExpertBytes quantized_experts_bytes(const QuantizationConfig& q, const nn::MoeExperts& experts) {
  const int64_t E = experts.num_experts(), I = experts.gate_up_proj.global_shape[1] / 2,
                H = experts.gate_up_proj.global_shape[2];
  const nn::ParamShard& gu = experts.gate_up_proj.shard;
  const nn::ParamShard& dn = experts.down_proj.shard;
  auto total = [](const std::vector<ChunkSpan>& spans) {
    int64_t n = 0;
    for (const ChunkSpan& s : spans) n += s.size;
    return n;
  };
  const bool by_experts = !gu.replicated() && gu.dim == 0;
  const int64_t local = by_experts ? total(gu.spans) : E;
  // Rows of gate and of up (out), inputs of down (in) a rank holds.
  const int64_t rows = by_experts || gu.replicated() ? I : total(gu.spans) / 2;
  const int64_t inputs = by_experts || dn.replicated() ? I : total(dn.spans);
  const int64_t gate = quantized_slice_bytes(q, {I, H}, {rows, H});
  const int64_t down = quantized_slice_bytes(q, {H, I}, {H, inputs});
  return {local * 2 * gate, local * down};
}

}  // namespace tp
