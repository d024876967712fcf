#pragma once
// The leaf modules models are built from. Member names are the checkpoint keys.
#include <optional>

#include "tp/nn/module.h"
#include "tp/ops/linear.h"
#include "tp/ops/quantized_linear.h"

namespace tp::nn {

// What an adapter (tp/peft: LoRA) adds to a Linear's or an Embedding's output:
// called inside the module's forward with its input (activations or ids) and its
// own output, both this rank's local pieces, before the style's output hook (so
// a row-parallel partial sum is reduced together with the base's).
class Adapter {
 public:
  virtual ~Adapter() = default;
  virtual Tensor forward(const Tensor& input, const Tensor& base_out) = 0;
};

// y = x W^T + b.  W [out_features, in_features] (Hugging Face layout), b [out_features].
class Linear : public Module {
 public:
  Linear(std::string name, int64_t in_features, int64_t out_features, bool bias);
  int64_t in_features() const { return weight.global_shape[1]; }
  int64_t out_features() const { return weight.global_shape[0]; }
  Parameter& weight;
  Parameter* bias = nullptr;
  // Row-parallel styles add the (replicated) bias once, after the reduction.
  bool add_bias_in_forward = true;
  // The arithmetic of the unpacked path; unset: the weight's dtype. BF16 with an
  // f32 weight holding bf16 values is mixed precision where bf16 GEMMs are slow
  // (see ops::linear).
  std::optional<DType> compute_dtype;

  // Inference uses weights packed once for oneDNN; training uses the plain weight
  // so the optimizer's updates are seen without repacking. For inference only,
  // the plain copy is released unless another module shares it (tied lm_head).
  void finalize_weights(bool inference_only) override;
  void release_packed_weights() override;
  // The matrix's dtype (also after the plain copy was released); f32 before loading.
  // A quantized weight answers the dtype the rest of the model loaded in (what
  // caches and activations around it use).
  DType weight_dtype() const;

  // The weight as a quantized checkpoint holds it (models/quantized_checkpoint.h),
  // set by the loader instead of `weight.data`: inference only, the product runs
  // on the codes (ops::QuantizedLinear). `model_dtype`: the other weights' dtype.
  void set_quantized(ops::QuantizedLinear w, DType model_dtype);
  const ops::QuantizedLinear& quantized() const { return quantized_; }
  // Packed in bf16: a bf16 input goes to the GEMM as is (it would round an f32
  // input to bf16 first). Any other path widens a bf16 input to f32, exactly.
  bool takes_bf16_input() const { return packed_valid_ && packed_dtype_ == DType::BF16 && !adapter_; }

  // Set by a parent that runs this weight inside one GEMM with its siblings
  // (nn::FusedLinears: q|k|v, gate|up), before finalize_weights: then no packed
  // copy of its own is made (the parent's holds the values), and the parent
  // computes its output. Cleared by release_packed_weights (training, merges).
  void mark_fused(DType packed_dtype);
  bool fused() const { return fused_; }

  void set_adapter(std::unique_ptr<Adapter> adapter) { adapter_ = std::move(adapter); }
  Adapter* adapter() const { return adapter_.get(); }

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override;

 private:
  Tensor base_forward(const Tensor& x);
  std::unique_ptr<Adapter> adapter_;
  ops::PackedLinear packed_;
  ops::QuantizedLinear quantized_;
  bool packed_valid_ = false;
  bool fused_ = false;
  DType packed_dtype_ = DType::F32;  // packed_'s, or the fused copy's
};

// Rows of W [num_embeddings, dim] looked up by id. A vocab-parallel style sets
// `vocab_start`: this rank holds rows [vocab_start, vocab_start + local rows).
class Embedding : public Module {
 public:
  Embedding(std::string name, int64_t num_embeddings, int64_t dim);
  Parameter& weight;
  int64_t vocab_start = 0;

  void set_adapter(std::unique_ptr<Adapter> adapter) { adapter_ = std::move(adapter); }
  Adapter* adapter() const { return adapter_.get(); }

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override;

 private:
  std::unique_ptr<Adapter> adapter_;
};

// y = w * x / sqrt(mean(x^2) + eps) over the last dim, in f32. With
// weight_offset 1 (Gemma), y = (1 + w) * ...: the weight starts at zeros, as
// Transformers initialises it, so that the norm starts as the plain one.
class RMSNorm : public Module {
 public:
  RMSNorm(std::string name, int64_t dim, double eps, double weight_offset = 0.0);
  Parameter& weight;
  double eps;
  double weight_offset;

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override;
};

}  // namespace tp::nn
