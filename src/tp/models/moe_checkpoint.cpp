#include "tp/models/moe_checkpoint.h"

#include <algorithm>
#include <cctype>

namespace tp {

namespace {

// One Hub tensor's rows [offset, offset + rows) of the fused parameter's dim 1.
struct Part {
  std::string key;
  int64_t offset;
  int64_t rows;
};


}  // namespace

bool reads_from_hub_names(const Checkpoint& ckpt, const std::string& param) {
  if (ckpt.has(param) || layer_prefix(param).empty()) return false;
  return param.ends_with(".mlp.experts.gate_up_proj") || param.ends_with(".mlp.experts.down_proj") ||
         param.ends_with(".mlp.gate.weight");
}

Tensor read_from_hub_names(const Checkpoint& ckpt, const std::string& param, const Shape& shape,
                           const nn::ParamShard& shard, DType as) {
  const std::string layer = layer_prefix(param);
  if (param.ends_with(".mlp.gate.weight")) {  // Mixtral's router under its Hub name
    const std::string key = layer + "block_sparse_moe.gate.weight";
    TP_CHECK(ckpt.has(key), "{}: the checkpoint has neither '{}' nor '{}'", ckpt.dir().string(), param, key);
    TP_CHECK(ckpt.info(key).shape == shape, "{}: tensor '{}' has shape {}, but config.json implies {}",
             ckpt.info(key).file.string(), key, shape_str(ckpt.info(key).shape), shape_str(shape));
    return shard.replicated() ? ckpt.read(key, as) : ckpt.read_slice(key, shard.dim, shard.spans, as);
  }
  const bool gate_up = param.ends_with(".gate_up_proj");
  const HubNaming* naming = nullptr;
  for (const HubNaming& n : kNamings)
    if (ckpt.has(expert_key(layer, n, 0, gate_up ? n.gate : n.down))) naming = &n;
  TP_CHECK(naming != nullptr, "{}: the checkpoint has no tensor '{}', nor its per-expert tensors ('{}' or '{}')",
           ckpt.dir().string(), param, expert_key(layer, kNamings[0], 0, gate_up ? "w1" : "w2"),
           expert_key(layer, kNamings[1], 0, gate_up ? "gate_proj" : "down_proj"));
  TP_CHECK(shape.size() == 3, "read_from_hub_names: '{}' is not a 3-D expert parameter ({})", param, shape_str(shape));
  const int64_t E = shape[0], A = shape[1], B = shape[2];
  auto parts_of = [&](int64_t e) -> std::vector<Part> {
    if (gate_up) return {{expert_key(layer, *naming, e, naming->gate), 0, A / 2},
                         {expert_key(layer, *naming, e, naming->up), A / 2, A / 2}};
    return {{expert_key(layer, *naming, e, naming->down), 0, A}};
  };

  const int64_t d = shard.replicated() ? -1 : shard.dim;
  std::vector<ChunkSpan> experts = d == 0 ? shard.spans : std::vector<ChunkSpan>{{0, E}};
  Shape local = shape;
  if (d >= 0) {
    local[d] = 0;
    for (const ChunkSpan& s : shard.spans) local[d] += s.size;
  }
  Tensor out = Tensor::empty(local, as);
  const Tensor flat = out.flatten();
  int64_t filled = 0;  // elements of `out` written so far, in order
  auto append = [&](const Tensor& piece) {
    TP_CHECK(filled + piece.numel() <= flat.numel(),
             "read_from_hub_names: the pieces of '{}' overflow its local shape {}", param, shape_str(local));
    flat.narrow(0, filled, piece.numel()).copy_from(piece);
    filled += piece.numel();
  };
  for (const ChunkSpan& span : experts)
    for (int64_t e = span.offset; e < span.offset + span.size; ++e) {
      const std::vector<Part> parts = parts_of(e);
      for (const Part& p : parts) {
        TP_CHECK(ckpt.has(p.key), "{}: tensor '{}' (expert {} of '{}') is missing", ckpt.dir().string(), p.key, e,
                 param);
        const io::TensorInfo& info = ckpt.info(p.key);
        TP_CHECK(info.shape == (Shape{p.rows, B}), "{}: tensor '{}' has shape {}, but config.json implies {}",
                 info.file.string(), p.key, shape_str(info.shape), shape_str(Shape{p.rows, B}));
      }
      if (d == 1) {  // each span of rows from the part(s) it covers, in order (packed: gate chunk, then up chunk)
        for (const ChunkSpan& rows : shard.spans)
          for (const Part& p : parts) {
            const int64_t lo = std::max(rows.offset, p.offset);
            const int64_t hi = std::min(rows.offset + rows.size, p.offset + p.rows);
            if (lo < hi) append(ckpt.read_slice(p.key, 0, {{lo - p.offset, hi - lo}}, as));
          }
      } else {
        for (const Part& p : parts)
          append(d == 2 ? ckpt.read_slice(p.key, 1, shard.spans, as) : ckpt.read(p.key, as));
      }
    }
  TP_CHECK(filled == out.numel(),
           "read_from_hub_names: the pieces of '{}' do not fill its local shape {}", param, shape_str(local));
  return out;
}

}  // namespace tp
