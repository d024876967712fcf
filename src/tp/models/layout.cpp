#include "tp/models/layout.h"

#include <array>

#include "tp/models/moe.h"
#include "tp/models/deepseek_config.h"
#include "tp/core/error.h"

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

// The checkpoint of `c` with decoder layers [first, last) (the tensors outside
// the layers only when `outside`).
std::vector<ParamSpec> layout_of(const ModelConfig& c, int64_t first, int64_t last, bool outside = true) {
  const std::string& mt = c.model_type;
  TP_CHECK(has_known_layout(mt),
           "no checkpoint layout for model_type '{}'; supported: llama, mistral, qwen3, mixtral, qwen3_moe, gpt_oss, "
           "deepseek_v2, deepseek_v3",
           mt);
  const bool gpt_oss = mt == "gpt_oss";
  const bool is_mla = mt == "deepseek_v2" || mt == "deepseek_v3";
  const bool moe_model = mt == "mixtral" || mt == "qwen3_moe" || gpt_oss || is_mla;
  const MoeConfig moe = moe_model ? MoeConfig::from(c) : MoeConfig{};
  using I = ParamSpec::Init;
  const int64_t H = c.hidden_size, D = c.head_dim, F = c.intermediate_size;
  const int64_t Q = checked_mul(c.num_attention_heads, D, "num_attention_heads x head_dim");
  const int64_t KV = checked_mul(c.num_key_value_heads, D, "num_key_value_heads x head_dim");
  // Mistral's attention has no biases; Llama's mlp_bias is a raw key only it has.
  const bool attn_bias = mt != "mistral" && c.attention_bias;
  const bool mlp_bias = mt == "llama" && c.raw_bool("mlp_bias", false);
  std::vector<ParamSpec> out;
  auto add = [&](std::string name, Shape shape, I init) {
    int64_t n = 1;
    for (int64_t s : shape) n = checked_mul(n, s, fmt::format("the element count of {} {}", name, shape_str(shape)));
    out.push_back({std::move(name), std::move(shape), init});
  };
  if (outside) add("model.embed_tokens.weight", {c.vocab_size, H}, I::Normal);
  // GPT-OSS's biases and sinks are drawn like its weights (not zeros), so that
  // a random test model exercises them.
  const I bias_init = gpt_oss ? I::Normal : I::Zeros;
  auto linear = [&](const std::string& name, int64_t out_f, int64_t in_f, bool bias) {
    add(name + ".weight", {out_f, in_f}, I::Normal);
    if (bias) add(name + ".bias", {out_f}, bias_init);
  };
  // DeepSeek's multi-head latent attention (deepseek_v2.h), in its modules' order.
  auto mla = [&](const std::string& L, const DeepseekSizes& d) {
    const int64_t heads = c.num_attention_heads;
    const int64_t QK = checked_mul(heads, d.qk_head_dim(), "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)");
    if (d.q_lora_rank > 0) {
      linear(L + "self_attn.q_a_proj", d.q_lora_rank, H, c.attention_bias);
      add(L + "self_attn.q_a_layernorm.weight", {d.q_lora_rank}, I::Ones);
      linear(L + "self_attn.q_b_proj", QK, d.q_lora_rank, false);
    } else {
      linear(L + "self_attn.q_proj", QK, H, false);
    }
    linear(L + "self_attn.kv_a_proj_with_mqa", d.kv_lora_rank + d.qk_rope_head_dim, H, c.attention_bias);
    add(L + "self_attn.kv_a_layernorm.weight", {d.kv_lora_rank}, I::Ones);
    linear(L + "self_attn.kv_b_proj",
           checked_mul(heads, d.qk_nope_head_dim + d.v_head_dim, "num_attention_heads x (qk_nope_head_dim + v_head_dim)"),
           d.kv_lora_rank, false);
    linear(L + "self_attn.o_proj", H, checked_mul(heads, d.v_head_dim, "num_attention_heads x v_head_dim"),
           c.attention_bias);
  };
  const DeepseekSizes ds = is_mla ? deepseek_sizes(c) : DeepseekSizes{};
  for (int64_t i = first; i < last; ++i) {
    const std::string L = fmt::format("model.layers.{}.", i);
    if (is_mla) {
      mla(L, ds);
    } else {
      linear(L + "self_attn.q_proj", Q, H, attn_bias);
      linear(L + "self_attn.k_proj", KV, H, attn_bias);
      linear(L + "self_attn.v_proj", KV, H, attn_bias);
      linear(L + "self_attn.o_proj", H, Q, attn_bias);
    }
    if (gpt_oss) add(L + "self_attn.sinks", {c.num_attention_heads}, I::Normal);
    if (mt == "qwen3" || mt == "qwen3_moe") {
      add(L + "self_attn.q_norm.weight", {D}, I::Ones);
      add(L + "self_attn.k_norm.weight", {D}, I::Ones);
    }
    if (gpt_oss) {
      // Fused on the Hub already: x @ W layout, gate/up columns interleaved (tp/ops/moe_experts.h).
      const int64_t E = moe.num_experts, EI = moe.expert_intermediate;
      linear(L + "mlp.router", E, H, true);
      add(L + "mlp.experts.gate_up_proj", {E, H, checked_mul(2, EI, "2 x intermediate_size")}, I::Normal);
      add(L + "mlp.experts.gate_up_proj_bias", {E, 2 * EI}, I::Normal);
      add(L + "mlp.experts.down_proj", {E, EI, H}, I::Normal);
      add(L + "mlp.experts.down_proj_bias", {E, H}, I::Normal);
    } else if (moe_model && moe.is_sparse_layer(i)) {
      // The Hub's per-expert tensors (fused into 3-D parameters at load: tp/models/moe_checkpoint.h).
      const int64_t E = moe.num_experts, EI = moe.expert_intermediate;
      const std::string block = L + (mt == "mixtral" ? "block_sparse_moe." : "mlp.");
      linear(block + "gate", E, H, false);
      // Transformers starts it at zero; random here, so that the tiny models test it choosing experts.
      if (moe.score_correction_bias) add(block + "gate.e_score_correction_bias", {E}, I::Normal);
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
      if (moe.shared_intermediate > 0) {  // DeepSeek
        linear(block + "shared_experts.gate_proj", moe.shared_intermediate, H, false);
        linear(block + "shared_experts.up_proj", moe.shared_intermediate, H, false);
        linear(block + "shared_experts.down_proj", H, moe.shared_intermediate, false);
      }
    } else {
      linear(L + "mlp.gate_proj", F, H, mlp_bias);
      linear(L + "mlp.up_proj", F, H, mlp_bias);
      linear(L + "mlp.down_proj", H, F, mlp_bias);
    }
    add(L + "input_layernorm.weight", {H}, I::Ones);
    add(L + "post_attention_layernorm.weight", {H}, I::Ones);
  }
  if (!outside) return out;
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
         model_type == "qwen3_moe" || model_type == "gpt_oss" || model_type == "deepseek_v2" ||
         model_type == "deepseek_v3";
}

std::vector<ParamSpec> checkpoint_layout(const ModelConfig& c) { return layout_of(c, 0, c.num_hidden_layers); }

LayoutCounts layout_counts(const ModelConfig& c) {
  LayoutCounts r;
  r.outside_layers = count(layout_of(c, 0, 0));
  // Layers come in two kinds at most (dense, and MoE where the config says so):
  // one layer of each kind is enumerated, the others are counted.
  const bool moe_model = c.model_type == "mixtral" || c.model_type == "qwen3_moe" || c.model_type == "deepseek_v2" ||
                         c.model_type == "deepseek_v3";
  const MoeConfig moe = moe_model ? MoeConfig::from(c) : MoeConfig{};
  std::array<int64_t, 2> params{-1, -1}, tensors{0, 0}, layers{0, 0};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const int kind = moe_model && moe.is_sparse_layer(i) ? 1 : 0;
    if (layers[kind]++ > 0) continue;
    const std::vector<ParamSpec> one = layout_of(c, i, i + 1, false);
    params[kind] = count(one);
    tensors[kind] = static_cast<int64_t>(one.size());
  }
  r.in_layers = 0;
  for (int k = 0; k < 2; ++k) {
    if (layers[k] == 0) continue;
    r.in_layers = checked_add(r.in_layers, checked_mul(layers[k], params[k], "num_hidden_layers x the parameters of "
                                                                             "one layer"),
                              "the parameter count");
    r.layer_tensors += layers[k] * tensors[k];
  }
  r.total = checked_add(r.outside_layers, r.in_layers, "the parameter count");
  return r;
}

}  // namespace tp
