// nn::FusedLinears: q|k|v (gate|up) as one GEMM must give every part's output bit
// for bit as its own packed GEMM does, so fusing never changes a generated token.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "tp/autograd/tape.h"
#include "tp/nn/fused_linears.h"

using namespace tp;

namespace {

// Linears named by their output sizes, with weights [n, k] of `dtype` from `seed`.
std::vector<std::unique_ptr<nn::Linear>> linears(const std::vector<int64_t>& outs, int64_t k, DType dtype,
                                                 uint64_t seed) {
  std::vector<std::unique_ptr<nn::Linear>> out;
  for (size_t i = 0; i < outs.size(); ++i) {
    auto l = std::make_unique<nn::Linear>("p" + std::to_string(i), k, outs[i], false);
    l->weight.data = Tensor::randn({outs[i], k}, seed + i, 0, 0.05f, dtype);
    out.push_back(std::move(l));
  }
  return out;
}

std::vector<nn::Linear*> raw(const std::vector<std::unique_ptr<nn::Linear>>& ls) {
  std::vector<nn::Linear*> out;
  for (const auto& l : ls) out.push_back(l.get());
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

TEST(FusedLinears, EveryPartBitForBitAsItsOwnGemm) {
  autograd::NoGradGuard no_grad;
  // qwen3-0.6b's q|k|v at tp = 1 and 2, its gate|up at tp = 2, and odd sizes.
  struct Case {
    std::vector<int64_t> outs;
    int64_t k;
  };
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (const Case& c : {Case{{2048, 1024, 1024}, 1024}, Case{{1024, 512, 512}, 1024}, Case{{1536, 1536}, 1024},
                          Case{{40, 24, 24}, 72}, Case{{17, 5}, 33}}) {
      auto separate = linears(c.outs, c.k, dtype, 7);
      auto fused = linears(c.outs, c.k, dtype, 7);
      for (auto& l : separate) l->finalize_weights(true);
      nn::FusedLinears f;
      f.fuse(raw(fused));
      ASSERT_TRUE(f.active());
      for (auto& l : fused) l->finalize_weights(true);
      EXPECT_FALSE(fused[0]->weight.data.defined()) << "inference only: the plain copy is released";
      EXPECT_EQ(f.takes_bf16_input(), dtype == DType::BF16);
      for (int64_t m : {1, 3, 16, 512}) {
        Tensor x = Tensor::randn({1, m, c.k}, 100 + m);
        std::vector<Tensor> inputs{x};
        if (dtype == DType::BF16) inputs.push_back(x.to(DType::BF16));  // what a norm writes for bf16 projections
        for (const Tensor& in : inputs) {
          std::vector<Tensor> ys = f.forward(in);
          ASSERT_EQ(ys.size(), separate.size());
          for (size_t i = 0; i < ys.size(); ++i)
            EXPECT_TRUE(bitwise_equal(ys[i], (*separate[i])(in)))
                << dtype_name(dtype) << " part " << i << " of " << c.outs.size() << ", m " << m << ", k " << c.k;
        }
      }
    }
  }
}

TEST(FusedLinears, PartsLeaveTheFusedGemmWhenReleased) {
  autograd::NoGradGuard no_grad;
  auto parts = linears({8, 4}, 16, DType::BF16, 1);
  nn::FusedLinears f;
  f.fuse(raw(parts));
  for (auto& l : parts) l->finalize_weights(true);
  ASSERT_TRUE(parts[0]->fused());
  EXPECT_EQ(parts[0]->weight_dtype(), DType::BF16);  // a KV cache's dtype is read off k_proj
  // A fused part's values live in the parent's GEMM: calling it alone is an error, not a silent zero.
  EXPECT_THROW((*parts[0])(Tensor::randn({1, 16}, 2)), Error);
  parts[1]->release_packed_weights();  // training or a merge: the weights are about to change
  EXPECT_FALSE(f.active());
}

TEST(FusedLinears, DeclinesWhatItCannotStack) {
  auto check_declined = [](std::vector<std::unique_ptr<nn::Linear>> parts, const char* why) {
    nn::FusedLinears f;
    f.fuse(raw(parts));
    EXPECT_FALSE(f.active()) << why;
    for (auto& l : parts) EXPECT_FALSE(l->fused()) << why;
  };
  auto k_differs = linears({8, 4}, 16, DType::BF16, 1);
  k_differs[1]->weight.data = Tensor::randn({4, 12}, 3, 0, 1, DType::BF16);
  check_declined(std::move(k_differs), "in_features differ");
  auto dtype_differs = linears({8, 4}, 16, DType::BF16, 1);
  dtype_differs[1]->weight.data = Tensor::randn({4, 16}, 3);
  check_declined(std::move(dtype_differs), "dtypes differ");
  std::vector<std::unique_ptr<nn::Linear>> biased;
  biased.push_back(std::make_unique<nn::Linear>("a", 16, 8, true));
  biased.push_back(std::make_unique<nn::Linear>("b", 16, 8, true));
  for (auto& l : biased) l->weight.data = Tensor::randn({8, 16}, 4, 0, 1, DType::BF16);
  check_declined(std::move(biased), "a bias");
  auto shared = linears({8, 8}, 16, DType::BF16, 1);
  Tensor other_owner = shared[0]->weight.data;  // a tied weight
  check_declined(std::move(shared), "a shared weight");
}
