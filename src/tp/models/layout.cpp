#include "tp/models/layout.h"

#include "tp/models/moe.h"
#include "tp/tensor/error.h"

namespace tp {

namespace {

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  TP_CHECK(!__builtin_mul_overflow(a, b, &r), "config sizes overflow: {} = {} x {} does not fit in 64 bits", what, a,
           b);
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  TP_CHECK(!__builtin_add_overflow(a, b, &r), "config sizes overflow: {} does not fit in 64 bits", what);
  return r;
}

// The checkpoint of `c` with decoder layers [first, end) (the tensors outside the layers always).
std::vector<ParamSpec> layout_with_layers(const ModelConfig& c, int64_t first, int64_t end) {
  const std::string& mt = c.model_type;
  TP_CHECK(has_known_layout(mt),
           "no checkpoint layout for model_type '{}'; supported: llama, mistral, qwen3, mixtral, qwen3_moe", mt);
  const bool moe_model = mt == "mixtral" || mt == "qwen3_moe";
  const MoeConfig moe = moe_model ? MoeConfig::from(c) : MoeConfig{};
  using I = ParamSpec::Init;
  const int64_t H = c.hidden_size, D = c.head_dim, F = c.intermediate_size;
  const int64_t Q = checked_mul(c.num_attention_heads, D, "num_attention_heads x head_dim");
  const int64_t KV = checked_mul(c.num_key_value_heads, D, "num_key_value_heads x head_dim");
  // Mistral's attention has no biases; Llama's mlp_bias is a raw key only it has.
  const bool attn_bias = mt != "mistral" && c.attention_bias;
  const bool mlp_bias = mt == "llama" && c.raw.value("mlp_bias", false) == true;
  std::vector<ParamSpec> out;
  auto add = [&](std::string name, Shape shape, I init) {
    int64_t n = 1;
    for (int64_t s : shape) n = checked_mul(n, s, fmt::format("the element count of {} {}", name, shape_str(shape)));
    out.push_back({std::move(name), std::move(shape), init});
  };
  add("model.embed_tokens.weight", {c.vocab_size, H}, I::Normal);
  auto linear = [&](const std::string& name, int64_t out_f, int64_t in_f, bool bias) {
    add(name + ".weight", {out_f, in_f}, I::Normal);
    if (bias) add(name + ".bias", {out_f}, I::Zeros);
  };
  for (int64_t i = first; i < end; ++i) {
    const std::string L = fmt::format("model.layers.{}.", i);
    linear(L + "self_attn.q_proj", Q, H, attn_bias);
    linear(L + "self_attn.k_proj", KV, H, attn_bias);
    linear(L + "self_attn.v_proj", KV, H, attn_bias);
    linear(L + "self_attn.o_proj", H, Q, attn_bias);
    if (mt == "qwen3" || mt == "qwen3_moe") {
      add(L + "self_attn.q_norm.weight", {D}, I::Ones);
      add(L + "self_attn.k_norm.weight", {D}, I::Ones);
    }
    if (moe_model && moe.is_sparse_layer(i)) {
      // The Hub's per-expert tensors (fused into 3-D parameters at load: tp/models/moe_checkpoint.h).
      const int64_t E = moe.num_experts, EI = moe.expert_intermediate;
      const std::string block = L + (mt == "mixtral" ? "block_sparse_moe." : "mlp.");
      linear(block + "gate", E, H, false);
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = fmt::format("{}experts.{}.", block, e);
        if (mt == "mixtral") {
          linear(x + "w1", EI, H, false);
          linear(x + "w2", H, EI, false);
          linear(x + "w3", EI, H, false);
        } else {
          linear(x + "gate_proj", EI, H, false);
          linear(x + "up_proj", EI, H, false);
          linear(x + "down_proj", H, EI, false);
        }
      }
    } else {
      linear(L + "mlp.gate_proj", F, H, mlp_bias);
      linear(L + "mlp.up_proj", F, H, mlp_bias);
      linear(L + "mlp.down_proj", H, F, mlp_bias);
    }
    add(L + "input_layernorm.weight", {H}, I::Ones);
    add(L + "post_attention_layernorm.weight", {H}, I::Ones);
  }
  add("model.norm.weight", {H}, I::Ones);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, H}, I::Normal);
  return out;
}

int64_t count(const std::vector<ParamSpec>& specs) {
  int64_t n = 0;
  for (const ParamSpec& p : specs) n = checked_add(n, numel(p.shape), "the parameter count");
  return n;
}

}  // namespace

bool has_known_layout(const std::string& model_type) {
  return model_type == "llama" || model_type == "mistral" || model_type == "qwen3" || model_type == "mixtral" ||
         model_type == "qwen3_moe";
}

std::vector<ParamSpec> checkpoint_layout(const ModelConfig& c) { return layout_with_layers(c, 0, c.num_hidden_layers); }

LayoutCounts layout_counts(const ModelConfig& c) {
  const std::vector<ParamSpec> none = layout_with_layers(c, 0, 0), one = layout_with_layers(c, 0, 1);
  LayoutCounts r;
  r.outside_layers = count(none);
  r.per_layer = count(one) - r.outside_layers;
  r.tensors_per_layer = static_cast<int64_t>(one.size() - none.size());
  // Qwen3-MoE mixes two kinds of layer (mlp_only_layers, decoder_sparse_step): each kind
  // counted once, times the layers of its kind.
  int64_t like_first = c.num_hidden_layers, other_kind = 0;
  if (c.model_type == "qwen3_moe" && c.num_hidden_layers > 0) {
    const MoeConfig moe = MoeConfig::from(c);
    int64_t other = -1;
    like_first = 0;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if (moe.is_sparse_layer(i) == moe.is_sparse_layer(0))
        ++like_first;
      else if (other < 0)
        other = i;
    }
    if (other >= 0) other_kind = count(layout_with_layers(c, other, other + 1)) - r.outside_layers;
  }
  const char* what = "num_hidden_layers x the parameters of one layer";
  const int64_t in_layers = checked_add(checked_mul(like_first, r.per_layer, what),
                                        checked_mul(c.num_hidden_layers - like_first, other_kind, what), what);
  r.total = checked_add(r.outside_layers, in_layers, "the parameter count");
  return r;
}

}  // namespace tp
