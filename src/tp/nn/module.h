#pragma once
// Module tree with Hugging Face names: a module's name is its full dotted
// path (model.layers.3.self_attn.q_proj) and a parameter's full name is
// "<module>.<local name>", which is also its safetensors key.
//
// Parameters hold this rank's local piece; `global_shape` and `shard` say what
// the piece is a piece of. A module with a parallel style runs the style's
// hooks around its forward (call()); model code never branches on tp.
#include <memory>
#include <string>
#include <vector>

#include "tp/nn/parallel_layer.h"
#include "tp/tensor/tensor.h"

namespace tp::nn {

// How a new checkpoint draws a parameter, as Transformers' _init_weights does
// for the module that owns it: Linear and Embedding weights normal(0,
// initializer_range), RMSNorm weights ones, Linear biases zeros.
enum class ParamInit { Normal, Ones, Zeros };

struct Parameter {
  std::string name;            // full name
  Shape global_shape;          // the checkpoint tensor's shape
  Tensor data;                 // this rank's local piece (undefined until loaded)
  ParamShard shard;  // which piece (replicated unless a style sharded it)
  ParamInit init = ParamInit::Normal;
};

// The shape of this rank's piece, from the global shape and the shard (known
// before any data is loaded, and after an unpacked weight was released).
Shape local_shape(const Parameter& p);

// What one call of a module needs beside its tensors (the positions, the KV
// cache, where router logits go): an architecture derives its own, and each
// module hands it on to the children that need it. No module keeps it past the call.
struct ForwardArgs {
  virtual ~ForwardArgs() = default;
};

class Module {
 public:
  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }

  // Runs the style's hooks (if any) around forward(), with this call's `args` if given.
  Tensor call(std::vector<Tensor> inputs, const ForwardArgs* args = nullptr) {
    return call_with_style(std::move(inputs), style_, args);
  }
  // The same under another style of the same parameter slices, for one call (a
  // column-parallel lm_head asked for its vocabulary slice instead of the
  // gathered logits); null: forward() alone. Runs on this module's mesh.
  Tensor call_with_style(std::vector<Tensor> inputs, const TensorParallelLayer* style,
                         const ForwardArgs* args = nullptr);
  Tensor operator()(const Tensor& x, const ForwardArgs* args = nullptr) { return call({x}, args); }

  // Children in registration order, then their children (pre-order, self first).
  std::vector<Module*> modules();
  std::vector<Parameter*> parameters();  // this module and all descendants
  std::vector<Parameter*> own_parameters();

  void set_style(const TensorParallelLayer* style, const dist::DeviceMesh* mesh);
  const TensorParallelLayer* style() const { return style_; }
  const dist::DeviceMesh* mesh() const { return mesh_; }

  // A child added after the model was built (an adapter's modules: LoRA's
  // lora_A / lora_B under the Linear they adapt). Named under this module.
  template <class M>
  M& adopt(std::unique_ptr<M> child) {
    return add_module(std::move(child));
  }
  // A parameter added after the model was built (LoRA's lora_embedding_A / _B on an Embedding).
  Parameter& adopt_parameter(const std::string& local_name, Shape global_shape) {
    return add_parameter(local_name, std::move(global_shape));
  }

  // Called once after this module's parameters are loaded (e.g. pack weights
  // for GEMM). With `inference_only`, a module may release what only training
  // needs (the unpacked copy of a weight nobody else shares).
  virtual void finalize_weights(bool inference_only) {}
  // True for a parent whose finalize_weights reads its children's loaded weights
  // (nn::FusedLinears packs several into one): the loader then loads the whole
  // subtree first and finalizes the parent before its children.
  virtual bool fuses_children() const { return false; }
  // Before weights change in place (training): drop what finalize_weights derived
  // from them (a packed copy would go stale).
  virtual void release_packed_weights() {}

 protected:
  virtual Tensor forward(const std::vector<Tensor>& inputs) = 0;
  // A call with arguments: a module that needs them (or passes them on)
  // overrides this; the others ignore them.
  virtual Tensor forward_with(const std::vector<Tensor>& inputs, const ForwardArgs& args) { return forward(inputs); }

  // Errors when the shape's element count does not fit in 64 bits (sizes from a config.json).
  Parameter& add_parameter(const std::string& local_name, Shape global_shape, ParamInit init = ParamInit::Normal);
  template <class M>
  M& add_module(std::unique_ptr<M> child) {
    M& ref = *child;
    children_.push_back(std::move(child));
    return ref;
  }
  std::string child_name(const std::string& local) const { return name_.empty() ? local : name_ + "." + local; }

 private:
  std::string name_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::unique_ptr<Module>> children_;
  const TensorParallelLayer* style_ = nullptr;
  const dist::DeviceMesh* mesh_ = nullptr;
};

}  // namespace tp::nn
