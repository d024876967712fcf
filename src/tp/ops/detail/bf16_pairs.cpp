#include "tp/ops/detail/bf16_pairs.h"

#include <array>
#include <cstring>
#include <memory>

#include "tp/core/parallel_for.h"
#include "tp/tensor/storage.h"

namespace tp::ops::detail {

namespace {

// A bf16 value's f32 bits (bf16 bits in the high half), a denormal made a zero of
// its sign: what VDPBF16PS multiplies.
inline uint32_t flushed(uint32_t bits) { return (bits & 0x7f800000u) == 0 ? bits & 0x80000000u : bits; }

// The packed layout's blocks: 32 rows of a panel (16 pairs x 64 columns x 2).
constexpr int64_t kRowBlock = 32;

}  // namespace

bool is_bf16_panel_layout(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.ndims != 2 || d.data_type != dnnl_bf16 || d.format_kind != dnnl_blocked) return false;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  if (b.inner_nblks != 3 || b.inner_blks[0] != 16 || b.inner_idxs[0] != 0 || b.inner_blks[1] != kPanelColumns ||
      b.inner_idxs[1] != 1 || b.inner_blks[2] != 2 || b.inner_idxs[2] != 0)
    return false;
  // Row blocks inside a panel, panels one after another.
  return b.strides[0] == kRowBlock * kPanelColumns && b.strides[1] == d.padded_dims[0] * kPanelColumns &&
         d.padded_dims[0] % kRowBlock == 0 && d.offset0 == 0;
}

void pair_swapped_rows(const void* x, DType x_dtype, int64_t m, int64_t k, float* out) {
  parallel_for(m, m * k > 65536, [&](int64_t i) {
    uint32_t* dst = reinterpret_cast<uint32_t*>(out + i * k);
    if (x_dtype == DType::BF16) {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(x) + i * k;
      for (int64_t j = 0; j < k; j += 2) {
        dst[j] = flushed(static_cast<uint32_t>(src[j + 1]) << 16);
        dst[j + 1] = flushed(static_cast<uint32_t>(src[j]) << 16);
      }
    } else {
      const float* src = static_cast<const float*>(x) + i * k;
      for (int64_t j = 0; j < k; j += 2) {
        dst[j] = flushed(static_cast<uint32_t>(to_bf16(src[j + 1]).bits) << 16);
        dst[j + 1] = flushed(static_cast<uint32_t>(to_bf16(src[j]).bits) << 16);
      }
    }
  });
}

void pair_swapped_panels(const bf16* packed, const dnnl::memory::desc& md, int64_t first, int64_t count, float* out) {
  const int64_t k = md.data.dims[0], rows = paired_k_rows(k);
  const int64_t panel_stride = md.data.format_desc.blocking.strides[1];
  parallel_for(count, count > 1 && k * count > 4096, [&](int64_t p) {
    // One dword holds a pair: the even row's element in the low half, the odd row's in the high half.
    const uint32_t* src = reinterpret_cast<const uint32_t*>(packed + (first + p) * panel_stride);
    uint32_t* dst = reinterpret_cast<uint32_t*>(out + p * rows * kPanelColumns);
    for (int64_t r = 0; r < k; r += 2) {
      const uint32_t* pair =
          src + (r / kRowBlock) * (kRowBlock / 2) * kPanelColumns + (r % kRowBlock) / 2 * kPanelColumns;
      uint32_t* even = dst + r * kPanelColumns;
      uint32_t* odd = even + kPanelColumns;
      for (int64_t j = 0; j < kPanelColumns; ++j) {
        even[j] = flushed(pair[j] & 0xffff0000u);
        odd[j] = flushed(pair[j] << 16);
      }
    }
    std::memset(dst + k * kPanelColumns, 0, static_cast<size_t>((rows - k) * kPanelColumns) * sizeof(float));
  });
}

float* paired_scratch(int slot, size_t n) {
  thread_local std::array<std::shared_ptr<Storage>, 3> buffers;
  std::shared_ptr<Storage>& b = buffers.at(static_cast<size_t>(slot));
  if (!b || b->bytes() < n * sizeof(float)) b = Storage::allocate(n * sizeof(float));
  return static_cast<float*>(b->data());
}

}  // namespace tp::ops::detail
