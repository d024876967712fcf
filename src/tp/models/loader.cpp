#include "tp/models/loader.h"

#include "tp/models/moe_checkpoint.h"
#include "tp/models/mxfp4.h"
#include "tp/models/quantized_checkpoint.h"
#include "tp/models/quantized_experts.h"
#include "tp/nn/layers.h"
#include "tp/nn/moe.h"

namespace tp {

namespace {

bool same_slice(const nn::ParamShard& a, const nn::ParamShard& b) {
  if (a.spans.size() != b.spans.size() || a.dim != b.dim) return false;
  for (size_t i = 0; i < a.spans.size(); ++i)
    if (a.spans[i].offset != b.spans[i].offset || a.spans[i].size != b.spans[i].size) return false;
  return true;
}

// Experts kept packed at inference: a quantized checkpoint's per-expert Linears (GPTQ / AWQ / compressed-tensors;
// inference only), and GPT-OSS's MXFP4 experts where this rank's slices hold whole blocks of 32 inputs (else, and
// for training, they are read dequantised below).
bool load_packed_experts(nn::Module& module, const Checkpoint& ckpt, DType dtype, bool inference_only) {
  auto* experts = dynamic_cast<nn::MoeExperts*>(&module);
  if (experts == nullptr) return false;
  if (reads_quantized_experts(ckpt, *experts)) {
    TP_CHECK(inference_only,
             "{}: the experts of '{}' are quantized ({}): their codes can be held for inference only; training, "
             "LoRA included, needs them unquantized", ckpt.dir().string(), experts->name(),
             ckpt.config().quantization->method);
    QuantizedExperts q = read_quantized_experts(ckpt, *experts);
    experts->set_packed(std::move(q.gate), std::move(q.down), std::move(q.up), dtype);
    return true;
  }
  if (!inference_only || !experts->layout().gpt_oss) return false;
  nn::Parameter &gate_up = experts->gate_up_proj, &down = experts->down_proj;
  if (!reads_mxfp4(ckpt, gate_up.name) || !reads_mxfp4(ckpt, down.name)) return false;
  std::vector<ops::QuantizedLinear> gu = read_mxfp4_packed(ckpt, gate_up.name, gate_up.global_shape, gate_up.shard);
  std::vector<ops::QuantizedLinear> dn = read_mxfp4_packed(ckpt, down.name, down.global_shape, down.shard);
  if (gu.empty() || dn.empty()) return false;
  experts->set_packed(std::move(gu), std::move(dn), {}, dtype);
  return true;
}

void load_own_parameters(nn::Module& module, const Checkpoint& ckpt, DType dtype,
                         const std::map<std::string, std::string>& tied,
                         const std::map<std::string, nn::Parameter*>& by_name, bool inference_only) {
  const bool packed_experts = load_packed_experts(module, ckpt, dtype, inference_only);
  for (nn::Parameter* p : module.own_parameters()) {
    if (packed_experts && (p == &static_cast<nn::MoeExperts&>(module).gate_up_proj ||
                           p == &static_cast<nn::MoeExperts&>(module).down_proj))
      continue;
    std::string source = p->name;
    DType as = p->global_shape.size() >= 2 ? dtype : DType::F32;
    if (reads_quantized(ckpt, p->name)) {  // GPTQ / AWQ / compressed-tensors: the codes stay packed
      auto* linear = dynamic_cast<nn::Linear*>(&module);
      TP_CHECK(linear != nullptr && p == &linear->weight,
               "{}: '{}' is quantized in the checkpoint, but only a Linear's weight can be held quantized",
               ckpt.dir().string(), p->name);
      // Loaded for training too: frozen under a LoRA adapter (QLoRA); the Trainer refuses to train it.
      TP_CHECK(!tied.count(p->name),
               "{}: '{}' is quantized in the checkpoint, but config.json ties it to '{}' (tie_word_embeddings true); "
               "a quantized lm_head is a tensor of its own: set tie_word_embeddings to false",
               ckpt.dir().string(), p->name, tied.count(p->name) ? tied.at(p->name) : "");
      QuantizedSlice q = read_quantized(ckpt, p->name, p->global_shape, p->shard);
      linear->set_quantized(ops::QuantizedLinear(q.bits, q.group_size, q.codes, q.scales, q.zeros, q.g_idx), dtype);
      continue;
    }
    if (reads_mxfp4(ckpt, p->name)) {  // GPT-OSS's MXFP4 experts: this rank's slice dequantised
      p->data = read_mxfp4(ckpt, p->name, p->global_shape, p->shard, as);
      continue;
    }
    if (reads_from_hub_names(ckpt, p->name)) {  // per-expert Hub tensors, fused here
      p->data = read_from_hub_names(ckpt, p->name, p->global_shape, p->shard, as);
      continue;
    }
    if (!ckpt.has(source)) {
      auto t = tied.find(p->name);
      if (t != tied.end()) source = t->second;
    }
    TP_CHECK(ckpt.has(source), "{}: the checkpoint has no tensor '{}' (needed by this {} model)", ckpt.dir().string(),
             source, ckpt.config().model_type);
    const io::TensorInfo& info = ckpt.info(source);
    TP_CHECK(info.shape == p->global_shape, "{}: tensor '{}' has shape {}, but config.json implies {}",
             info.file.string(), source, shape_str(info.shape), shape_str(p->global_shape));
    if (source != p->name) {
      nn::Parameter* owner = by_name.count(source) ? by_name.at(source) : nullptr;
      if (owner != nullptr && owner->data.defined() && same_slice(owner->shard, p->shard)) {
        p->data = owner->data;
        continue;
      }
    }
    p->data = p->shard.replicated() ? ckpt.read(source, as) : ckpt.read_slice(source, p->shard.dim, p->shard.spans, as);
  }
}

}  // namespace

void load_parameters(nn::Module& root, const Checkpoint& ckpt, DType dtype,
                     const std::map<std::string, std::string>& tied, bool inference_only, bool pack) {
  std::map<std::string, nn::Parameter*> by_name;
  for (nn::Parameter* p : root.parameters()) by_name[p->name] = p;
  check_quantized_shards(ckpt, root.parameters());  // a shard that cuts a group: before any weight is read
  for (const nn::Module* m : root.modules())
    if (const auto* experts = dynamic_cast<const nn::MoeExperts*>(m); experts && reads_quantized_experts(ckpt, *experts))
      check_quantized_expert_shards(ckpt, *experts);
  // Pre-order, each module packed right after its own weights are read (peak
  // memory: the plain copies go as the packed ones come), except that a parent
  // fusing its children's weights gets its whole subtree read first.
  const std::vector<nn::Module*> all = root.modules();
  for (size_t i = 0; i < all.size(); ++i) {
    nn::Module* m = all[i];
    if (!pack || !m->fuses_children()) {
      load_own_parameters(*m, ckpt, dtype, tied, by_name, inference_only);
      if (pack) m->finalize_weights(inference_only);
      continue;
    }
    const std::vector<nn::Module*> subtree = m->modules();  // m first: all[i, i + size)
    for (nn::Module* s : subtree) load_own_parameters(*s, ckpt, dtype, tied, by_name, inference_only);
    for (nn::Module* s : subtree) s->finalize_weights(inference_only);
    i += subtree.size() - 1;
  }
}

}  // namespace tp
