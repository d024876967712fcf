#pragma once
// Helpers shared by the multi-rank suites: deterministic per-rank inputs that
// every rank can rebuild, so each rank computes the serial reference itself.
#include <gtest/gtest.h>

#include "tp/distributed/process_group.h"
#include "tp/tensor/tensor.h"

namespace tp::dist::testing {

// Rank r's input: small integers (exact in every dtype, so sums are exact) or,
// for f32, normal values.
inline Tensor rank_input(const Shape& shape, int rank, DType dtype, uint64_t salt = 0) {
  if (dtype == DType::F32) return Tensor::randn(shape, 1000 + 17 * rank + salt);
  Tensor f = Tensor::rand(shape, 2000 + 17 * rank + salt, -8.f, 8.f);
  std::vector<float> v = f.to_vector();
  for (float& x : v) x = static_cast<float>(static_cast<int>(x));
  Tensor out = Tensor::empty(shape, dtype);
  out.copy_from(Tensor::from_vector(v, shape));
  return out;
}

// Fails (non-fatally: collectives after it still run) with the first bad index.
inline void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  std::vector<float> g = got.to_vector(), w = want.to_vector();
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i])))) {
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", expected " << w[i] << " (rank "
                    << world_rank() << ")";
      return;
    }
}

}  // namespace tp::dist::testing
