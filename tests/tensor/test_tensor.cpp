#include <gtest/gtest.h>

#include "tp/tensor/convert.h"
#include "tp/tensor/tensor.h"

using namespace tp;

TEST(Tensor, CreationAndAlignment) {
  Tensor t = Tensor::zeros({3, 5});
  EXPECT_EQ(t.shape(), (Shape{3, 5}));
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  for (float v : t.to_vector()) EXPECT_EQ(v, 0.f);
  Tensor e = Tensor::empty({0, 4});
  EXPECT_EQ(e.numel(), 0);
  Tensor s = Tensor::full({}, 2.5);
  EXPECT_EQ(s.item(), 2.5);
}

// Every tensor says where its bytes are; views share their storage's device.
TEST(Tensor, LivesOnTheCpu) {
  Tensor t = Tensor::zeros({4, 8});
  EXPECT_EQ(t.device(), Device{});
  EXPECT_EQ(t.device().type, DeviceType::CPU);
  EXPECT_EQ(device_name(t.narrow(0, 1, 2).device()), "cpu");
  EXPECT_EQ(t.storage()->device(), t.reshape({32}).device());
}

TEST(Tensor, ReshapeIsAViewAndChecksCounts) {
  Tensor t = Tensor::arange(12, DType::I64);
  Tensor r = t.reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  EXPECT_TRUE(r.same_storage(t));
  EXPECT_THROW(t.reshape({5, 3}), Error);
  try {
    t.reshape({5, 3});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[12]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[5, 3]"), std::string::npos) << e.what();
  }
}

TEST(Tensor, NarrowViewsContiguousSlicesAndCopiesOthers) {
  Tensor t = Tensor::arange(24, DType::I64).reshape({4, 6});
  Tensor rows = t.narrow(0, 1, 2);
  EXPECT_TRUE(rows.same_storage(t));
  EXPECT_EQ(rows.to_int_vector(), (std::vector<int64_t>{6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}));
  Tensor cols = t.narrow(1, 4, 2);
  EXPECT_FALSE(cols.same_storage(t));
  EXPECT_EQ(cols.to_int_vector(), (std::vector<int64_t>{4, 5, 10, 11, 16, 17, 22, 23}));
  EXPECT_THROW(t.narrow(1, 5, 2), Error);
}

TEST(Tensor, ChunkFollowsTorchRule) {
  // 10 rows over 4: 3, 3, 3, 1.  3 rows over 4: 1, 1, 1, (none).
  auto c = Tensor::zeros({10, 2}).chunk(4, 0);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[3].size(0), 1);
  EXPECT_EQ(chunk_span(10, 4, 3).offset, 9);
  EXPECT_EQ(chunk_span(10, 4, 3).size, 1);
  EXPECT_EQ(chunk_span(3, 4, 3).size, 0);
  EXPECT_EQ(chunk_span(5, 4, 3).size, 0);  // chunk 2: 2, 2, 1, 0
  EXPECT_EQ(chunk_span(5, 4, 2).size, 1);
}

TEST(Tensor, CatAndTransposeRoundTrip) {
  Tensor a = Tensor::randn({2, 3, 4}, 1);
  Tensor b = Tensor::randn({2, 5, 4}, 2);
  Tensor c = cat({a, b}, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 8, 4}));
  EXPECT_TRUE(equal(c.narrow(1, 3, 5), b));
  Tensor t = c.transpose(0, 2);
  EXPECT_EQ(t.shape(), (Shape{4, 8, 2}));
  EXPECT_EQ(t.at(((1 * 8) + 6) * 2 + 1), c.at(((1 * 8) + 6) * 4 + 1));
  EXPECT_TRUE(equal(t.transpose(2, 0), c));
  EXPECT_THROW(cat({a, Tensor::zeros({2, 3, 5})}, 1), Error);
}

TEST(Tensor, Bf16AndF16ConversionsRoundToNearestEven) {
  std::vector<float> v = {1.0f, -2.5f, 3.14159f, 1e-3f, 65504.f, 0.f, 1.00390625f, 1.01171875f};
  Tensor x = Tensor::from_vector(v, {8});
  Tensor b = x.to(DType::BF16);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b.data<bf16>()[i].bits, to_bf16(v[i]).bits);
  EXPECT_EQ(to_f32(to_bf16(1.00390625f)), 1.0f);  // tie -> even
  EXPECT_EQ(to_f32(to_bf16(1.01171875f)), 1.015625f);
  // Long vectors take the SIMD path; both directions agree with the scalar code.
  Tensor big = Tensor::randn({1001}, 7);
  Tensor bb = big.to(DType::BF16), hh = big.to(DType::F16);
  for (int64_t i = 0; i < 1001; ++i) {
    float f = big.data<float>()[i];
    EXPECT_EQ(bb.data<bf16>()[i].bits, to_bf16(f).bits);
    EXPECT_EQ(hh.data<f16>()[i].bits, to_f16(f).bits);
  }
  std::vector<float> back = bb.to_vector();
  for (int64_t i = 0; i < 1001; ++i) EXPECT_EQ(back[i], to_f32(bb.data<bf16>()[i]));
}

TEST(Tensor, RandomIsDeterministic) {
  Tensor a = Tensor::randn({1000}, 42), b = Tensor::randn({1000}, 42), c = Tensor::randn({1000}, 43);
  EXPECT_TRUE(equal(a, b));
  EXPECT_FALSE(equal(a, c));
  double mean = 0, var = 0;
  for (float v : a.to_vector()) mean += v;
  mean /= 1000;
  for (float v : a.to_vector()) var += (v - mean) * (v - mean);
  EXPECT_NEAR(mean, 0, 0.15);
  EXPECT_NEAR(var / 1000, 1, 0.15);
  Tensor u = Tensor::rand({1000}, 3, -2, 2);
  for (float v : u.to_vector()) EXPECT_TRUE(v >= -2 && v < 2);
}

TEST(Tensor, DtypeMismatchNamesBoth) {
  Tensor t = Tensor::zeros({2}, DType::BF16);
  try {
    t.data<float>();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos);
  }
  EXPECT_THROW(parse_dtype("f8"), Error);
}

TEST(Storage, ExactAllocationsTakeNoLargerCachedBlockAndNoHugePageRounding) {
  // A freed 4 MiB block is in the cache; a 3 MiB + 64 B weight buffer must not take it
  // (allocate would, rounded up to 4 MiB), and must hold exactly its 64-byte multiple.
  { Storage::allocate(size_t{4} << 20); }
  AllocatorStats before = allocator_stats();
  auto w = Storage::allocate_exact((size_t{3} << 20) + 50);
  AllocatorStats after = allocator_stats();
  EXPECT_LE(after.system_allocations, before.system_allocations + 1);  // at most a new slab
  EXPECT_EQ(after.cached_bytes, before.cached_bytes);  // the cached block stayed cached
  EXPECT_EQ(after.live_bytes - before.live_bytes, (size_t{3} << 20) + 64);
  EXPECT_EQ(w->bytes(), (size_t{3} << 20) + 50);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data()) % 64, 0u);
  // Small buffers sit back to back in one huge-page slab (no 4 KiB pages, no
  // rounding): the next one starts right after, and neither asked the OS again.
  auto a = Storage::allocate_exact(size_t{1} << 20);
  AllocatorStats mid = allocator_stats();
  auto b = Storage::allocate_exact(100);
  EXPECT_EQ(static_cast<char*>(b->data()), static_cast<char*>(a->data()) + (size_t{1} << 20));
  EXPECT_EQ(allocator_stats().system_allocations, mid.system_allocations);
  // A large buffer gets a slab of its own, on a huge-page boundary.
  auto big = Storage::allocate_exact(size_t{40} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big->data()) % (size_t{2} << 20), 0u);
  EXPECT_EQ(big->bytes(), size_t{40} << 20);
  // Freed pieces leave the live count.
  size_t live = allocator_stats().live_bytes;
  big.reset();
  b.reset();
  EXPECT_EQ(live - allocator_stats().live_bytes, (size_t{40} << 20) + 128);
}

TEST(Storage, CacheReusesFreedBuffers) {
  void* first;
  {
    Tensor t = Tensor::empty({1 << 20});
    first = t.raw_data();
  }
  size_t before = allocator_stats().system_allocations;
  Tensor again = Tensor::empty({1 << 20});
  EXPECT_EQ(again.raw_data(), first);
  EXPECT_EQ(allocator_stats().system_allocations, before);
}
