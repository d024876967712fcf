#pragma once
// The kernels behind ops/mxfp4.h, one set per device (ops/dispatch.h). Tensors
// are as ops/mxfp4.h names them; outputs are allocated by the op.
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct Mxfp4Kernels {
  // out f32 [E, n, O] = the input rows [lo, lo + n) of blocks / scales, transposed.
  void (*dequantise)(const Tensor& blocks, const Tensor& scales, int64_t lo, const Tensor& out);
  // codes u8 [O, G * 32] = one expert's blocks [O, G, 16] unpacked, a nibble a byte.
  void (*codes)(const Tensor& blocks, const Tensor& codes);
  // w f32 [E, in, out] -> blocks [E, O, G, 16] (zeroed by the caller: nibbles are or-ed in) and scales [E, O, G].
  void (*quantise)(const Tensor& w, const Tensor& blocks, const Tensor& scales);
};

KernelTable<Mxfp4Kernels>& mxfp4_kernels();

}  // namespace tp::ops
