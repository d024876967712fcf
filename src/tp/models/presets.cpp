#include "tp/models/presets.h"

#include <algorithm>
#include <functional>
#include <map>

#include "tp/models/deepseek_v2.h"
#include "tp/models/variants.h"
#include "tp/tensor/random.h"

namespace tp {

namespace {

using nlohmann::json;

const char* kTransformersVersion = "4.51.0";

json llama_tp_plan() {
  return {{"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
          {"layers.*.self_attn.v_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"},
          {"layers.*.mlp.gate_proj", "colwise"},    {"layers.*.mlp.up_proj", "colwise"},
          {"layers.*.mlp.down_proj", "rowwise"}};
}

// The keys Transformers writes for each architecture; the sizes vary per preset.
struct Sizes {
  int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_pos;
  double rope_theta, eps;
  bool tied;
  std::string dtype;
  int64_t bos, eos;
};

json common_keys(const Sizes& s) {
  return {{"attention_dropout", 0.0},
          {"bos_token_id", s.bos},
          {"eos_token_id", s.eos},
          {"head_dim", s.head_dim},
          {"hidden_act", "silu"},
          {"hidden_size", s.hidden},
          {"initializer_range", 0.02},
          {"intermediate_size", s.intermediate},
          {"max_position_embeddings", s.max_pos},
          {"num_attention_heads", s.heads},
          {"num_hidden_layers", s.layers},
          {"num_key_value_heads", s.kv_heads},
          {"rms_norm_eps", s.eps},
          {"rope_theta", s.rope_theta},
          {"tie_word_embeddings", s.tied},
          {"torch_dtype", s.dtype},
          {"transformers_version", kTransformersVersion},
          {"use_cache", true},
          {"vocab_size", s.vocab}};
}

json llama_config(const Sizes& s, json rope_scaling = nullptr) {
  json j = common_keys(s);
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
  j["rope_scaling"] = rope_scaling;
  j["base_model_tp_plan"] = llama_tp_plan();
  return j;
}

json mistral_config(const Sizes& s, json sliding_window) {
  json j = common_keys(s);
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["sliding_window"] = sliding_window;
  j["base_model_tp_plan"] = llama_tp_plan();
  return j;
}

json qwen3_config(const Sizes& s) {
  json j = common_keys(s);
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["attention_bias"] = false;
  j["max_window_layers"] = s.layers;
  j["rope_scaling"] = nullptr;
  j["sliding_window"] = nullptr;
  j["use_sliding_window"] = false;
  json plan = llama_tp_plan();
  plan["layers.*.self_attn.q_norm"] = "replicated_with_grad_allreduce";
  plan["layers.*.self_attn.k_norm"] = "replicated_with_grad_allreduce";
  j["base_model_tp_plan"] = plan;
  return j;
}

// Qwen2 / Qwen2.5 write no head_dim (hidden_size / num_attention_heads) and no attention_bias
// (their q/k/v always have biases).
json qwen2_config(const Sizes& s, int64_t sliding_window) {
  json j = common_keys(s);
  j.erase("head_dim");
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["model_type"] = "qwen2";
  j["max_window_layers"] = s.layers;
  j["sliding_window"] = sliding_window;
  j["use_sliding_window"] = false;
  j["base_model_tp_plan"] = llama_tp_plan();
  return j;
}

// Phi-3's keys (Phi3Config): the context it was trained on (original_max_position_embeddings,
// where longrope switches to long_factor), its window, and Transformers' plan for the fused
// projections (gathered outputs: q|k|v and gate|up are cut after them).
json phi3_config(const Sizes& s, int64_t original_max, json sliding_window, json rope_scaling) {
  json j = common_keys(s);
  j.erase("head_dim");  // hidden_size / num_attention_heads
  j["architectures"] = {"Phi3ForCausalLM"};
  j["model_type"] = "phi3";
  j["attention_bias"] = false;
  j["embd_pdrop"] = 0.0;
  j["resid_pdrop"] = 0.0;
  j["original_max_position_embeddings"] = original_max;
  j["pad_token_id"] = s.eos;
  j["sliding_window"] = sliding_window;
  j["rope_scaling"] = rope_scaling;
  j["base_model_tp_plan"] = {{"layers.*.self_attn.qkv_proj", "colwise_rep"},
                             {"layers.*.self_attn.o_proj", "rowwise_rep"},
                             {"layers.*.mlp.gate_up_proj", "colwise_rep"},
                             {"layers.*.mlp.down_proj", "rowwise_rep"}};
  return j;
}

// Phi-3.5-mini's LongRoPE factors (its config.json), 48 per list for 96 rotary dims.
json phi35_longrope() {
  return {{"long_factor",
           {1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601,  1.5899999141693115,
            1.600000023841858,  1.6200000047683716, 2.620000123977661,  3.2300000190734863, 3.2300000190734863,
            4.789999961853027,  7.400000095367432,  7.700000286102295,  9.09000015258789,   12.199999809265137,
            17.670000076293945, 24.46000099182129,  28.57000160217285,  30.420001983642578, 30.840002059936523,
            32.590003967285156, 32.93000411987305,  42.320003509521484, 44.96000289916992,  50.340003967285156,
            50.45000457763672,  57.55000305175781,  57.93000411987305,  58.21000289916992,  60.1400032043457,
            62.61000442504883,  62.62000274658203,  62.71000289916992,  63.1400032043457,   63.1400032043457,
            63.77000427246094,  63.93000411987305,  63.96000289916992,  63.970001220703125, 64.02999877929688,
            64.06999969482422,  64.08000183105469,  64.12000274658203,  64.41000366210938,  64.4800033569336,
            64.51000213623047,  64.52999877929688,  64.83999633789062}},
          {"short_factor",
           {1.0,                1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842,
            1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979,
            1.0999999046325684, 1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662,
            1.2899998426437378, 1.339999794960022,  1.679999828338623,  1.7899998426437378, 1.8199998140335083,
            1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745,
            2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
            2.0199997425079346, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
            2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
            2.0799996852874756, 2.0899996757507324, 2.189999580383301,  2.2199995517730713, 2.5899994373321533,
            2.729999542236328,  2.749999523162842,  2.8399994373321533}},
          {"type", "longrope"}};
}

// The tiny preset's: 6 factors for 12 rotary dims (head_dim 16 x partial_rotary_factor 0.75),
// the long ones larger, as trained lists are.
json tiny_longrope() {
  return {{"long_factor", {1.0, 1.5, 2.5, 4.0, 6.0, 8.0}},
          {"short_factor", {1.0, 1.05, 1.1, 1.2, 1.4, 1.5}},
          {"type", "longrope"}};
}

// Gemma 3 text (google/gemma-3-1b-pt's keys): no hidden_act (hidden_activation), tied
// embeddings by default (no key), one in every `pattern` layers global.
json gemma3_config(const Sizes& s, int64_t sliding_window, int64_t pattern, double query_pre_attn_scalar,
                   json rope_scaling, json final_logit_softcapping) {
  json j = common_keys(s);
  j.erase("hidden_act");
  if (s.tied) j.erase("tie_word_embeddings");
  j["architectures"] = {"Gemma3ForCausalLM"};
  j["model_type"] = "gemma3_text";
  j["attention_bias"] = false;
  j["attn_logit_softcapping"] = nullptr;
  j["cache_implementation"] = "hybrid";
  j["final_logit_softcapping"] = final_logit_softcapping;
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["pad_token_id"] = 0;
  j["query_pre_attn_scalar"] = query_pre_attn_scalar;
  j["rope_local_base_freq"] = 10000.0;
  j["rope_scaling"] = rope_scaling;
  j["sliding_window"] = sliding_window;
  j["sliding_window_pattern"] = pattern;
  return j;
}

// Mixtral's expert entries (Transformers' MixtralConfig.base_model_tp_plan / _ep_plan).
json moe_tp_plan_entries(json plan) {
  plan["layers.*.mlp.experts.gate_up_proj"] = "packed_colwise";
  plan["layers.*.mlp.experts.down_proj"] = "rowwise";
  plan["layers.*.mlp.experts"] = "moe_tp_experts";
  return plan;
}

struct MoeSizes {
  int64_t experts, top_k, expert_intermediate;
};

// Mixtral's and GPT-OSS's MoE keys (experts sized by intermediate_size).
void local_expert_keys(json& j, const MoeSizes& m, double router_aux_loss_coef) {
  j["intermediate_size"] = m.expert_intermediate;  // per expert
  j["num_local_experts"] = m.experts;
  j["num_experts_per_tok"] = m.top_k;
  j["output_router_logits"] = false;
  j["router_aux_loss_coef"] = router_aux_loss_coef;
}

json mixtral_config(const Sizes& s, const MoeSizes& m) {
  json j = common_keys(s);
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  local_expert_keys(j, m, 0.02);
  j["router_jitter_noise"] = 0.0;
  j["sliding_window"] = nullptr;
  json plan = llama_tp_plan();
  for (const char* dense : {"layers.*.mlp.gate_proj", "layers.*.mlp.up_proj", "layers.*.mlp.down_proj"})
    plan.erase(dense);
  j["base_model_tp_plan"] = moe_tp_plan_entries(plan);
  j["base_model_ep_plan"] = {{"layers.*.mlp.gate", "ep_router"},
                             {"layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
                             {"layers.*.mlp.experts.down_proj", "grouped_gemm"},
                             {"layers.*.mlp.experts", "moe_tp_experts"}};
  return j;
}

// s.intermediate is the dense MLP's (mlp_only_layers); m.expert_intermediate is moe_intermediate_size.
json qwen3_moe_config(const Sizes& s, const MoeSizes& m) {
  json j = qwen3_config(s);
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["model_type"] = "qwen3_moe";
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = json::array();
  j["moe_intermediate_size"] = m.expert_intermediate;
  j["num_experts"] = m.experts;
  j["num_experts_per_tok"] = m.top_k;
  j["norm_topk_prob"] = true;
  j["output_router_logits"] = false;
  j["router_aux_loss_coef"] = 0.001;
  j["base_model_tp_plan"] = moe_tp_plan_entries(j["base_model_tp_plan"]);
  j["base_model_ep_plan"] = {{"layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
                             {"layers.*.mlp.experts.down_proj", "grouped_gemm"},
                             {"layers.*.mlp.experts", "ep_dispatch_experts"}};
  return j;
}

// GPT-OSS (openai/gpt-oss-20b's keys): layers alternate sliding-window and full
// attention, starting with a sliding one; yarn RoPE without truncation.
json gpt_oss_config(const Sizes& s, const MoeSizes& m, int64_t sliding_window, json rope_scaling) {
  json j = common_keys(s);
  j["architectures"] = {"GptOssForCausalLM"};
  j["model_type"] = "gpt_oss";
  j["attention_bias"] = true;
  local_expert_keys(j, m, 0.9);
  j["experts_per_token"] = m.top_k;
  j["swiglu_limit"] = 7.0;
  j["sliding_window"] = sliding_window;
  json types = json::array();
  for (int64_t i = 0; i < s.layers; ++i) types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  j["rope_scaling"] = rope_scaling;
  json plan = json::object();
  for (const auto& [key, style] : gpt_oss_variant(ModelConfig::from_json(j, "preset gpt_oss")).default_plan)
    plan[key] = style;
  j["base_model_tp_plan"] = plan;
  return j;
}

json gpt_oss_yarn(double factor, int64_t original) {
  return {{"rope_type", "yarn"}, {"factor", factor}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
          {"original_max_position_embeddings", original}, {"truncate", false}};
}

// DeepSeek-V2 / V3 (DeepSeek-V2-Lite's and DeepSeek-V3's keys, as Transformers
// writes them: head_dim is qk_rope_head_dim).
struct MlaSizes {
  json q_lora_rank;  // null: q_proj
  int64_t kv_lora_rank, qk_nope, qk_rope, v_head;
};
// The MoE layers: from first_k_dense, `moe` experts (of which top_k per token)
// plus `shared` shared experts; topk_method and groups as the checkpoint's.
struct DeepseekMoe {
  int64_t first_k_dense, shared;
  MoeSizes moe;
  std::string topk_method;
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
};

json deepseek_config(const std::string& model_type, const Sizes& s, const MlaSizes& m, const DeepseekMoe& e,
                     json rope_scaling) {
  const bool v3 = model_type == "deepseek_v3";
  json j = common_keys(s);
  j["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  j["model_type"] = model_type;
  j["attention_bias"] = false;
  j["head_dim"] = m.qk_rope;
  j["q_lora_rank"] = m.q_lora_rank;
  j["kv_lora_rank"] = m.kv_lora_rank;
  j["qk_nope_head_dim"] = m.qk_nope;
  j["qk_rope_head_dim"] = m.qk_rope;
  j["v_head_dim"] = m.v_head;
  j["first_k_dense_replace"] = e.first_k_dense;
  j["n_routed_experts"] = e.moe.experts;
  j["n_shared_experts"] = e.shared;
  j["num_experts_per_tok"] = e.moe.top_k;
  j["moe_intermediate_size"] = e.moe.expert_intermediate;
  j["moe_layer_freq"] = 1;
  j["n_group"] = e.n_group;
  j["topk_group"] = e.topk_group;
  j["topk_method"] = e.topk_method;
  j["norm_topk_prob"] = v3;
  j["routed_scaling_factor"] = e.routed_scaling_factor;
  if (v3)
    j["rope_interleave"] = true;
  else
    j["scoring_func"] = "softmax";
  j["rope_scaling"] = rope_scaling;
  const DeepseekSizes sizes{.q_lora_rank = m.q_lora_rank.is_null() ? 0 : 1, .v3 = v3};
  json plan = json::object();
  for (const auto& [key, style] : deepseek_base_tp_plan(sizes)) plan[key] = style;
  j["base_model_tp_plan"] = plan;
  json ep_plan = json::object();
  for (const auto& [key, style] : deepseek_base_ep_plan()) ep_plan[key] = style;
  j["base_model_ep_plan"] = ep_plan;
  return j;
}

// V2-Lite's yarn over a short original context (64): factor 4 = max_position_embeddings / 64.
json tiny_yarn() {
  return {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}, {"beta_fast", 32},
          {"beta_slow", 1}, {"mscale", 0.707}, {"mscale_all_dim", 0.707}};
}

// The released checkpoints' yarn: factor 40 over 4096 positions (163840 = 40 x 4096).
json long_yarn(double mscale) {
  return {{"type", "yarn"}, {"factor", 40.0}, {"original_max_position_embeddings", 4096}, {"beta_fast", 32},
          {"beta_slow", 1}, {"mscale", mscale}, {"mscale_all_dim", mscale}};
}

// V3's yarn (mscale = mscale_all_dim = 1) over the same short original context.
json tiny_yarn_v3() {
  return {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}, {"beta_fast", 32},
          {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
}

// Tiny presets split over 1, 2, 3 and 4 ranks, as the equivalence tests need:
// 24 query heads over 12 KV heads (GQA; 12 divides by 1-4), intermediate sizes
// divisible by 12, and vocab 516 = 12 * 43, which lm_head's
// colwise_gather_output must split evenly. Other shapes (KV heads replicated at
// tp > kv heads, uneven vocab) come from --set in the tests.
const std::map<std::string, std::map<std::string, std::function<json()>>>& presets() {
  static const std::map<std::string, std::map<std::string, std::function<json()>>> table = {
      {"llama",
       {{"tiny", [] { return llama_config({192, 384, 2, 24, 12, 8, 516, 256, 10000.0, 1e-5, false, "float32", 1, 2}); }},
        {"llama-2-7b",
         [] { return llama_config({4096, 11008, 32, 32, 32, 128, 32000, 4096, 10000.0, 1e-5, false, "float16", 1, 2}); }},
        {"llama-3-8b",
         [] {
           return llama_config(
               {4096, 14336, 32, 32, 8, 128, 128256, 8192, 500000.0, 1e-5, false, "bfloat16", 128000, 128001});
         }},
        {"llama-3.2-1b", [] {
           return llama_config(
               {2048, 8192, 16, 32, 8, 64, 128256, 131072, 500000.0, 1e-5, true, "bfloat16", 128000, 128001},
               {{"factor", 32.0},
                {"high_freq_factor", 4.0},
                {"low_freq_factor", 1.0},
                {"original_max_position_embeddings", 8192},
                {"rope_type", "llama3"}});
         }}}},
      {"mistral",
       {{"tiny",
         [] { return mistral_config({192, 384, 2, 24, 12, 8, 516, 256, 10000.0, 1e-5, false, "float32", 1, 2}, nullptr); }},
        {"mistral-7b", [] {
           return mistral_config({4096, 14336, 32, 32, 8, 128, 32000, 32768, 10000.0, 1e-5, false, "bfloat16", 1, 2},
                                 4096);
         }}}},
      // 8 experts split over ep 1, 2, 4; expert intermediate 48 over tp 1-4. The
      // real shapes (mixtral-8x7b: 2.8 GB per bf16 layer; qwen3-30b-a3b: 1.2 GB)
      // fit this machine cut to a few layers: make-model --layers 2.
      {"mixtral",
       {{"tiny",
         [] {
           return mixtral_config({64, 48, 2, 24, 12, 8, 516, 256, 1e6, 1e-5, false, "float32", 1, 2}, {8, 2, 48});
         }},
        {"mixtral-8x7b", [] {
           return mixtral_config({4096, 14336, 32, 32, 8, 128, 32000, 32768, 1e6, 1e-5, false, "bfloat16", 1, 2},
                                 {8, 2, 14336});
         }}}},
      {"qwen3_moe",
       {{"tiny",
         [] {
           return qwen3_moe_config({64, 96, 2, 24, 12, 16, 516, 256, 1e6, 1e-6, false, "float32", 1, 2}, {8, 2, 48});
         }},
        {"qwen3-30b-a3b", [] {
           return qwen3_moe_config(
               {2048, 6144, 48, 32, 4, 128, 151936, 40960, 1e6, 1e-6, false, "bfloat16", 151643, 151645},
               {128, 8, 768});
         }}}},
      // 8 experts (ep 1, 2, 4), top-4, expert intermediate 48 over tp 1-4; a window
      // of 4 so that the tests' prompts run past it. gpt-oss-20b is 1.6 GB per bf16
      // layer: make-model --layers 2 fits this machine.
      {"gpt_oss",
       {{"tiny",
         [] {
           return gpt_oss_config({64, 48, 2, 24, 12, 8, 516, 256, 150000.0, 1e-5, false, "float32", 1, 2}, {8, 4, 48},
                                 4, gpt_oss_yarn(4.0, 64));
         }},
        {"gpt-oss-20b", [] {
           return gpt_oss_config(
               {2880, 2880, 24, 64, 8, 64, 201088, 131072, 150000.0, 1e-5, false, "bfloat16", 199998, 200002},
               {32, 4, 2880}, 128, gpt_oss_yarn(32.0, 4096));
         }}}},
      // Layer 0 dense, layer 1 MoE: 8 experts (ep 1, 2, 4) of intermediate 24
      // (tp 1-4), top-2, shared experts; tiny-q-lora routes group-limited (2
      // groups, 1 kept); V3's noaux_tc over 4 groups of 2, 2 kept.
      {"deepseek_v2",
       {{"tiny",
         [] {
           return deepseek_config("deepseek_v2", {96, 96, 2, 12, 12, 8, 516, 256, 10000.0, 1e-6, false, "float32", 1, 2},
                                  {nullptr, 32, 16, 8, 16}, {1, 2, {8, 2, 24}, "greedy"}, tiny_yarn());
         }},
        {"tiny-q-lora", [] {
           return deepseek_config("deepseek_v2", {96, 96, 2, 12, 12, 8, 516, 256, 10000.0, 1e-6, false, "float32", 1, 2},
                                  {24, 32, 16, 8, 16}, {1, 1, {8, 2, 24}, "group_limited_greedy", 2, 1, 1.5},
                                  tiny_yarn());
         }},
        // DeepSeek-V2-Lite's shapes (a 1.4 GB bf16 MoE layer; cut with make-model --layers).
        {"deepseek-v2-lite", [] {
           return deepseek_config(
               "deepseek_v2", {2048, 10944, 27, 16, 16, 64, 102400, 163840, 10000.0, 1e-6, false, "bfloat16", 100000, 100001},
               {nullptr, 512, 128, 64, 128}, {1, 2, {64, 6, 1408}, "greedy"}, long_yarn(0.707));
         }}}},
      {"deepseek_v3",
       {{"tiny",
         [] {
           return deepseek_config("deepseek_v3", {96, 96, 2, 12, 12, 8, 516, 256, 10000.0, 1e-6, false, "float32", 1, 2},
                                  {24, 32, 16, 8, 16}, {1, 1, {8, 2, 24}, "noaux_tc", 4, 2, 2.5}, tiny_yarn_v3());
         }},
        // DeepSeek-V3's shapes in bf16 (the Hub's are FP8 blocks; 23 GB per MoE layer: --layers 4 fits).
        {"deepseek-v3", [] {
           return deepseek_config(
               "deepseek_v3", {7168, 18432, 61, 128, 128, 64, 129280, 163840, 10000.0, 1e-6, false, "bfloat16", 0, 1},
               {1536, 512, 128, 64, 128}, {3, 1, {256, 8, 2048}, "noaux_tc", 8, 4, 2.5}, long_yarn(1.0));
         }}}},
      // Qwen2.5-0.5B (tied, 14 heads over 2 KV heads) and Qwen2.5-7B; tiny's heads split over 1-4 ranks.
      {"qwen2",
       {{"tiny", [] { return qwen2_config({192, 384, 2, 24, 12, 8, 516, 256, 1e6, 1e-6, true, "float32", 1, 2}, 256); }},
        {"qwen2.5-0.5b",
         [] {
           return qwen2_config(
               {896, 4864, 24, 14, 2, 64, 151936, 32768, 1e6, 1e-6, true, "bfloat16", 151643, 151643}, 32768);
         }},
        {"qwen2.5-7b", [] {
           return qwen2_config(
               {3584, 18944, 28, 28, 4, 128, 152064, 131072, 1e6, 1e-6, false, "bfloat16", 151643, 151643}, 131072);
         }}}},
      // tiny: 12 query heads over 6 KV heads of 16 (q|k|v 384 and gate|up 768 wide, split
      // 1-4 ways), 12 of each head's 16 dims rotary, LongRoPE trained on 32 positions of
      // 256: the tests' longer prompts and generations switch to long_factor.
      {"phi3",
       {{"tiny",
         [] {
           json j = phi3_config({192, 384, 2, 12, 6, 16, 516, 256, 10000.0, 1e-5, false, "float32", 1, 2}, 32, nullptr,
                                tiny_longrope());
           j["partial_rotary_factor"] = 0.75;
           return j;
         }},
        {"phi-3-mini-4k",
         [] {
           return phi3_config({3072, 8192, 32, 32, 32, 96, 32064, 4096, 10000.0, 1e-5, false, "bfloat16", 1, 32000},
                              4096, 2047, nullptr);
         }},
        {"phi-3.5-mini", [] {
           return phi3_config(
               {3072, 8192, 32, 32, 32, 96, 32064, 131072, 10000.0, 1e-5, false, "bfloat16", 1, 32000}, 4096, 262144,
               phi35_longrope());
         }}}},
      // tiny: layer 0 sliding (window 4, base 10000), layer 1 global (base 1e6, linear x8), a
      // query_pre_attn_scalar other than head_dim, logits capped at 2 (where tiny logits reach).
      {"gemma3_text",
       {{"tiny",
         [] {
           return gemma3_config({64, 192, 2, 24, 12, 16, 516, 256, 1e6, 1e-6, true, "float32", 2, 1}, 4, 2, 24.0,
                                {{"factor", 8.0}, {"rope_type", "linear"}}, 2.0);
         }},
        {"gemma-3-1b", [] {
           json j = gemma3_config({1152, 6912, 26, 4, 1, 256, 262144, 32768, 1e6, 1e-6, true, "bfloat16", 2, 1}, 512,
                                  6, 256.0, nullptr, nullptr);
           j["eos_token_id"] = {1, 106};
           return j;
         }},
        // google/gemma-3-4b-pt's language model (its text_config over Gemma3TextConfig's defaults) as a text model.
        {"gemma-3-4b", [] {
           json j = gemma3_config({2560, 10240, 34, 8, 4, 256, 262208, 131072, 1e6, 1e-6, true, "bfloat16", 2, 1}, 1024,
                                  6, 256.0, {{"factor", 8.0}, {"rope_type", "linear"}}, nullptr);
           j["eos_token_id"] = {1, 106};
           return j;
         }}}},
      {"qwen3",
       {{"tiny", [] { return qwen3_config({64, 192, 2, 24, 12, 16, 516, 256, 1e6, 1e-6, true, "float32", 1, 2}); }},
        {"qwen3-0.6b",
         [] {
           return qwen3_config(
               {1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e6, 1e-6, true, "bfloat16", 151643, 151645});
         }},
        {"qwen3-8b", [] {
           return qwen3_config(
               {4096, 12288, 36, 32, 8, 128, 151936, 40960, 1e6, 1e-6, false, "bfloat16", 151643, 151645});
         }}}},
  };
  return table;
}

template <class Map>
std::string keys_of(const Map& m) {
  std::string out;
  for (auto& [k, v] : m) out += (out.empty() ? "" : ", ") + k;
  return out;
}

}  // namespace

std::vector<std::string> preset_architectures() {
  std::vector<std::string> out;
  for (auto& [k, v] : presets()) out.push_back(k);
  return out;
}

std::vector<std::string> preset_names(const std::string& arch) {
  auto it = presets().find(arch);
  TP_CHECK(it != presets().end(), "unknown architecture '{}'; supported: {}", arch, keys_of(presets()));
  std::vector<std::string> out;
  for (auto& [k, v] : it->second) out.push_back(k);
  return out;
}

ModelConfig make_preset_config(const std::string& arch, const std::string& preset) {
  auto it = presets().find(arch);
  TP_CHECK(it != presets().end(), "unknown architecture '{}'; supported: {}", arch, keys_of(presets()));
  auto p = it->second.find(preset);
  TP_CHECK(p != it->second.end(), "unknown preset '{}' for architecture {}; supported: {}", preset, arch,
           keys_of(it->second));
  return ModelConfig::from_json(p->second(), fmt::format("preset {}/{}", arch, preset));
}

uint64_t param_seed(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return mix64(seed ^ mix64(h));
}

void init_param_into(const ParamSpec& spec, double std, uint64_t seed, DType dtype, void* dst) {
  const int64_t n = numel(spec.shape);
  if (spec.init == ParamSpec::Init::Normal)
    write_normal(dst, dtype, n, param_seed(seed, spec.name), static_cast<float>(std));
  else
    write_constant(dst, dtype, n, spec.init == ParamSpec::Init::Ones ? 1.f : 0.f);
}

Tensor init_param(const ParamSpec& spec, double std, uint64_t seed, DType dtype) {
  Tensor t = Tensor::empty(spec.shape, dtype);
  init_param_into(spec, std, seed, dtype, t.raw_data());
  return t;
}

}  // namespace tp
