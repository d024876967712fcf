#pragma once
// Helpers shared by the training suites.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "tp/distributed/process_group.h"
#include "tp/training/data.h"
#include "tp/training/lora.h"

namespace tp::testing {

// Token ids every rank can rebuild: a few distinct ids spread over the whole
// vocabulary (so every vocab shard owns targets), in a learnable pattern.
inline std::shared_ptr<training::TokenBlocks> synthetic_data(int64_t vocab, int64_t blocks, int64_t seq) {
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < blocks * seq; ++i)
    tokens.push_back(static_cast<int32_t>((i * 7 + (i / 5) * 3) % 23 * (vocab / 23) + 1));
  return std::make_shared<training::TokenBlocks>(training::TokenBlocks::from_tokens(tokens, seq));
}

// max |got - want| <= tol * max |want|: the tensor as a whole, like the logits tests.
inline void expect_close_rel(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  const double scale = std::max(max_abs(want), 1e-30);
  EXPECT_LE(max_abs_diff(got, want), tol * scale) << what << " at tp " << dist::world_size() << " (max |want| "
                                                  << scale << ")";
}

// PEFT's init with a non-zero B, so that A's gradients are not zero from the first step.
inline std::function<Tensor(const nn::Parameter&)> nonzero_lora_init(uint64_t seed) {
  return [seed](const nn::Parameter& p) {
    if (p.name.find("lora_B") != std::string::npos) return Tensor::randn(p.global_shape, p.name.size(), 0.f, 0.05f);
    return training::peft_init(seed)(p);
  };
}

inline void expect_near_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::abs(got - want), tol * std::max(std::abs(want), 1e-30)) << what << ": " << got << " vs " << want
                                                                         << " at tp " << dist::world_size();
}

}  // namespace tp::testing
