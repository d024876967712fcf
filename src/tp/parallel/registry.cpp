#include "tp/parallel/registry.h"

#include <mutex>

#include "tp/parallel/colwise.h"
#include "tp/parallel/embedding.h"
#include "tp/parallel/moe.h"
#include "tp/parallel/mla.h"
#include "tp/parallel/replicated.h"
#include "tp/parallel/rowwise.h"
#include "tp/parallel/sequence.h"

namespace tp::parallel {

namespace {

StyleRegistry shipped_styles() {
  auto colwise = std::make_shared<ColwiseParallel>();
  auto colwise_gather = std::make_shared<ColwiseParallel>(ColwiseParallel::Options{.gather_output = true});
  auto rowwise = std::make_shared<RowwiseParallel>();
  auto rowwise_split = std::make_shared<RowwiseParallel>(RowwiseParallel::Options{.split_input = true});
  return {
      {"colwise", colwise},
      {"colwise_gather_output", colwise_gather},
      {"colwise_rep", colwise_gather},
      {"rowwise", rowwise},
      {"rowwise_split_input", rowwise_split},
      {"rowwise_rep", rowwise_split},
      {"packed_colwise", std::make_shared<ColwiseParallel>(ColwiseParallel::Options{.split_factor = 2})},
      {"packed_rowwise", std::make_shared<RowwiseParallel>(RowwiseParallel::Options{.split_factor = 2})},
      {"embedding_rowwise", std::make_shared<EmbeddingRowwise>()},
      {"embedding_colwise", std::make_shared<EmbeddingColwise>()},
      {"sequence_parallel", std::make_shared<SequenceParallel>()},
      {"sequence_parallel_gather_output",
       std::make_shared<SequenceParallel>(SequenceParallel::Options{.gather_output = true})},
      {"gather_sequence_input", std::make_shared<GatherSequenceInput>()},
      {"scatter_sequence_output", std::make_shared<ScatterSequenceOutput>()},
      {"replicated_with_grad_allreduce", std::make_shared<ReplicatedWithGradAllreduce>()},
      {"all_reduce", std::make_shared<AllReduceOutput>()},
      {"local_params", std::make_shared<LocalParams>()},
      {"moe_tp_experts", std::make_shared<MoeTpExperts>()},
      {"moe_identity_expert", std::make_shared<MoeIdentityExpert>()},
      {"grouped_gemm", std::make_shared<GroupedGemm>()},
      {"ep_router", std::make_shared<EpRouter>()},
      {"ep_dispatch_experts", std::make_shared<EpDispatchExperts>()},
      {"mla_kv_a_proj", std::make_shared<MlaKvAProjParallel>()},
  };
}

std::mutex registry_mutex;

StyleRegistry& registry() {
  static StyleRegistry r = shipped_styles();
  return r;
}

}  // namespace

const StyleRegistry& parallel_styles() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return registry();
}

void register_style(const std::string& name, std::shared_ptr<const nn::TensorParallelLayer> style) {
  TP_CHECK(!name.empty(), "register_style: the style name must not be empty");
  TP_CHECK(style != nullptr, "register_style: style '{}' is null", name);
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry()[name] = std::move(style);
}

const nn::TensorParallelLayer* find_style(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second.get();
}

const nn::TensorParallelLayer& get_style(const std::string& name) {
  const nn::TensorParallelLayer* s = find_style(name);
  if (s == nullptr)
    fail("unsupported parallel style '{}'; supported styles are: {}", name, fmt::join(style_names(), ", "));
  return *s;
}

std::vector<std::string> style_names() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  std::vector<std::string> names;
  for (const auto& [name, style] : registry()) names.push_back(name);
  return names;
}

}  // namespace tp::parallel
