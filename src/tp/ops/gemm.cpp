#include "tp/ops/gemm.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tp/core/error.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/dnnl_context.h"
#include "tp/tensor/convert.h"
#include "tp/tensor/storage.h"

namespace tp::ops::detail {

namespace {

using dnnl::memory;
using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, DType, bool, int64_t, int64_t, int64_t, bool>;

memory::data_type dnnl_type(DType t) { return t == DType::BF16 ? memory::data_type::bf16 : memory::data_type::f32; }

struct Entry {
  dnnl::matmul prim;
  memory::desc a_md, b_md, bias_md, c_md, scratchpad_md;
};

std::mutex cache_mutex;
std::map<Key, Entry> cache;

const Entry& cached_primitive(const GemmSpec& s, bool has_bias) {
  Key key{s.m, s.n, s.k, s.trans_a, s.trans_b, s.a_dtype, has_bias, s.lda, s.ldb, s.ldc, s.accumulate};
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  memory::data_type dt = dnnl_type(s.a_dtype);
  // Transposed operands are described by strides, never copied.
  // Stored row lengths: A is [M, K] or (trans_a) [K, M]; B is [K, N] or (trans_b) [N, K].
  int64_t lda = s.lda ? s.lda : (s.trans_a ? s.m : s.k);
  int64_t ldb = s.ldb ? s.ldb : (s.trans_b ? s.k : s.n);
  int64_t ldc = s.ldc ? s.ldc : s.n;
  memory::desc a_md({s.m, s.k}, dt, s.trans_a ? memory::dims{1, lda} : memory::dims{lda, 1});
  memory::desc b_md({s.k, s.n}, dt, s.trans_b ? memory::dims{1, ldb} : memory::dims{ldb, 1});
  memory::desc bias_md = has_bias ? memory::desc({1, s.n}, memory::data_type::f32, memory::format_tag::ab)
                                  : memory::desc();
  memory::desc c_md({s.m, s.n}, memory::data_type::f32, memory::dims{ldc, 1});
  // The scratchpad is ours, one per thread (gemm_scratchpad): in library mode this
  // oneDNN build (no DNNL_ENABLE_CONCURRENT_EXEC) sizes a thread-local scratchpad
  // when a primitive is created, so a cached primitive that another OpenMP thread
  // created read and wrote past that thread's smaller one: attention's concurrent
  // bf16 and transposed-A GEMMs came out wrong, differently run to run.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (s.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, bias_md, c_md), attr, dnnl_engine());
  Entry e{dnnl::matmul(pd), a_md, b_md, bias_md, c_md, pd.scratchpad_desc()};
  return cache.emplace(key, std::move(e)).first->second;
}

void* gemm_scratchpad(size_t bytes) {
  thread_local std::shared_ptr<Storage> buffer;
  if (!buffer || buffer->bytes() < bytes) buffer = Storage::allocate(bytes);
  return buffer->data();
}

struct Bf16Choice {
  std::mutex mutex;
  int native = -1;  // -1: not decided yet
};
Bf16Choice& bf16_choice() {
  static Bf16Choice c;
  return c;
}

// The best of a few timed runs of [256 x 1024] x [1024 x 1024] in the given dtype.
double probe_gflops(DType dtype) {
  const int64_t m = 256, n = 1024, k = 1024;
  std::vector<char> a(static_cast<size_t>(m * k) * dtype_size(dtype)), b(static_cast<size_t>(k * n) * dtype_size(dtype));
  std::vector<float> c(static_cast<size_t>(m * n));
  // Small values in either encoding (zero bytes are zero in both), so no denormal slows anything.
  std::fill(a.begin(), a.end(), 0);
  std::fill(b.begin(), b.end(), 0);
  GemmSpec s{m, n, k, false, true, dtype, dtype};
  gemm(s, a.data(), b.data(), nullptr, c.data());
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    gemm(s, a.data(), b.data(), nullptr, c.data());
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * m * n * k / t / 1e9);
  }
  return best;
}

// TP_BF16_GEMM, read once: 1 "native", 0 "f32", 2 "widen", -1 unset (probe).
int bf16_gemm_env() {
  static const int choice = [] {
    const char* env = std::getenv("TP_BF16_GEMM");
    if (env == nullptr || *env == 0) return -1;
    const std::string v(env);
    TP_CHECK(v == "native" || v == "f32" || v == "widen", "TP_BF16_GEMM='{}' is not one of native, f32, widen", v);
    return v == "native" ? 1 : v == "f32" ? 0 : 2;
  }();
  return choice;
}

}  // namespace

bool bf16_matmul_available() {
  static const bool available = [] {
    if (bf16_gemm_env() == 2) return false;
    using dnnl::memory;
    const memory::desc ab({2, 2}, memory::data_type::bf16, memory::format_tag::ab);
    const memory::desc c({2, 2}, memory::data_type::f32, memory::format_tag::ab);
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ab, ab, memory::desc(), c), dnnl_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

bool bf16_gemm_native() {
  Bf16Choice& c = bf16_choice();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.native < 0) {
    const int env = bf16_gemm_env();
    TP_CHECK(env != 1 || bf16_matmul_available(),
             "TP_BF16_GEMM=native: oneDNN has no bf16 matmul for this CPU (it needs AVX-512); use f32 or leave it "
             "unset");
    c.native = !bf16_matmul_available() ? 0
               : env >= 0               ? env == 1
               : probe_gflops(DType::BF16) >= probe_gflops(DType::F32) ? 1
                                                                        : 0;
  }
  return c.native == 1;
}

bool bf16_gemm_forced_native() { return bf16_gemm_env() == 1; }

size_t gemm_primitives_created() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return cache.size();
}

namespace {

// convert(src, dst, count) over blocks of 64 Ki elements, split over OpenMP threads.
template <class From, class To, class Convert>
void convert_parallel(const From* src, To* dst, size_t n, Convert convert) {
  constexpr size_t kBlock = size_t{1} << 16;
  int64_t blocks = static_cast<int64_t>((n + kBlock - 1) / kBlock);
  parallel_for(blocks, blocks > 1, [&](int64_t b) {
    size_t start = static_cast<size_t>(b) * kBlock;
    convert(src + start, dst + start, std::min(kBlock, n - start));
  });
}

}  // namespace

void to_bf16_parallel(const float* src, bf16* dst, size_t n) { convert_parallel(src, dst, n, convert_f32_to_bf16); }

void round_to_bf16_parallel(const float* src, float* dst, size_t n) {
  convert_parallel(src, dst, n, round_f32_to_bf16);
}

void to_f32_parallel(const bf16* src, float* dst, size_t n) { convert_parallel(src, dst, n, convert_bf16_to_f32); }


bf16* bf16_scratch(size_t n) {
  // Storage rather than std::vector: 64-byte aligned rows for the GEMM's loads.
  thread_local std::shared_ptr<Storage> buffer;
  if (!buffer || buffer->bytes() < n * sizeof(bf16)) buffer = Storage::allocate(n * sizeof(bf16));
  return static_cast<bf16*>(buffer->data());
}

namespace {

// A row-major B whose row stride is a multiple of 2 KiB but not a power of two
// (3072, 5120, 6144, 12288 or 14336 floats: the MLPs' widths) ran oneDNN's brgemm
// at under half speed on this machine, e.g. 70 instead of 150 GFLOP/s for
// [512 x 1024] x [1024 x 3072] (cache-set conflicts between B's rows); the same
// product with 16 elements of padding per row ran at 170. So a large product
// copies such a B into padded rows first (K x N elements against 2 M K N flops).
bool conflicting_stride(size_t row_bytes) { return row_bytes % 2048 == 0 && (row_bytes & (row_bytes - 1)) != 0; }

const void* padded_copy(const void* b, int64_t rows, int64_t cols, int64_t ld, size_t esize, int64_t* new_ld) {
  *new_ld = cols + static_cast<int64_t>(64 / esize);  // (unconflicted_row_stride's)
  thread_local std::shared_ptr<Storage> buffer;
  const size_t bytes = static_cast<size_t>(rows * *new_ld) * esize;
  if (!buffer || buffer->bytes() < bytes) buffer = Storage::allocate(bytes);
  char* dst = static_cast<char*>(buffer->data());
  const char* src = static_cast<const char*>(b);
  const int64_t out_ld = *new_ld;
  parallel_for(rows, rows * cols > 65536, [&](int64_t r) {
    std::memcpy(dst + static_cast<size_t>(r * out_ld) * esize, src + static_cast<size_t>(r * ld) * esize,
                static_cast<size_t>(cols) * esize);
  });
  return dst;
}


}  // namespace

int64_t unconflicted_row_stride(int64_t cols, size_t esize) {
  return conflicting_stride(static_cast<size_t>(cols) * esize) ? cols + static_cast<int64_t>(64 / esize) : cols;
}

const float* bf16_valued_f32(const void* src, DType dtype, int64_t rows, int64_t cols, int64_t ld, int slot) {
  if (ld == 0) ld = cols;
  const size_t n = static_cast<size_t>((rows - 1) * ld + cols);
  thread_local std::shared_ptr<Storage> buffers[2];
  std::shared_ptr<Storage>& buffer = buffers[slot];
  if (!buffer || buffer->bytes() < n * sizeof(float)) buffer = Storage::allocate(n * sizeof(float));
  float* dst = static_cast<float*>(buffer->data());
  if (dtype == DType::BF16)
    to_f32_parallel(static_cast<const bf16*>(src), dst, n);
  else
    round_to_bf16_parallel(static_cast<const float*>(src), dst, n);
  return dst;
}

void gemm(const GemmSpec& spec, const void* a, const void* b, const float* bias, float* c) {
  GemmSpec s = spec;
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    // oneDNN rejects empty reductions; the product of nothing is zero (+ bias).
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        float& x = c[i * (s.ldc ? s.ldc : s.n) + j];
        x = (s.accumulate ? x : 0.f) + (bias ? bias[j] : 0.f);
      }
    return;
  }
  TP_CHECK(s.a_dtype == DType::F32 || s.a_dtype == DType::BF16, "gemm: A must be f32 or bf16, not {}",
           dtype_name(s.a_dtype));
  TP_CHECK(s.b_dtype == DType::F32 || s.b_dtype == DType::BF16, "gemm: B must be f32 or bf16, not {}",
           dtype_name(s.b_dtype));
  std::vector<bf16> b_converted;
  if (s.a_dtype != s.b_dtype)
    TP_CHECK(s.lda == 0 && s.ldb == 0, "gemm: mixed f32/bf16 operands must be dense");
  if ((s.a_dtype == DType::BF16 || s.b_dtype == DType::BF16) && !bf16_matmul_available()) {
    // The same products as an f32 GEMM of bf16 values: a bf16 value widens
    // exactly, and so does the product of two.
    a = bf16_valued_f32(a, s.a_dtype, s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda, 0);
    b = bf16_valued_f32(b, s.b_dtype, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb, 1);
    s.a_dtype = s.b_dtype = DType::F32;
  } else if (s.a_dtype != s.b_dtype) {
    // Mixed: compute in bf16 (the weight's precision), converting the f32 side.
    size_t a_n = static_cast<size_t>(s.m * s.k), b_n = static_cast<size_t>(s.k * s.n);
    if (s.a_dtype == DType::F32) {
      bf16* buf = bf16_scratch(a_n);
      to_bf16_parallel(static_cast<const float*>(a), buf, a_n);
      a = buf;
      s.a_dtype = DType::BF16;
    } else {
      b_converted.resize(b_n);
      to_bf16_parallel(static_cast<const float*>(b), b_converted.data(), b_n);
      b = b_converted.data();
      s.b_dtype = DType::BF16;
    }
  }
  const size_t b_size = dtype_size(s.b_dtype);
  const int64_t ldb = s.ldb ? s.ldb : s.n;
  if (!s.trans_b && s.m >= 64 && conflicting_stride(static_cast<size_t>(ldb) * b_size))
    b = padded_copy(b, s.k, s.n, ldb, b_size, &s.ldb);
  const Entry& e = cached_primitive(s, bias != nullptr);
  auto& engine = dnnl_engine();
  memory a_mem(e.a_md, engine, const_cast<void*>(a));
  memory b_mem(e.b_md, engine, const_cast<void*>(b));
  memory c_mem(e.c_md, engine, c);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(e.bias_md, engine, const_cast<float*>(bias)));
  if (size_t bytes = e.scratchpad_md.get_size())
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(e.scratchpad_md, engine, gemm_scratchpad(bytes)));
  e.prim.execute(dnnl_stream(), args);
  dnnl_stream().wait();
}

}  // namespace tp::ops::detail
