#pragma once
// The on-disk forms of quantized Linears (GPTQ, AWQ GEMM, compressed-tensors
// pack-quantized; models/quantized_shapes.h has their tensors): how their int32
// words hold 4- or 8-bit values, both ways, and the checks of what a checkpoint
// stores (finite scales, zero points, g_idx). They live in io/ because they
// parse and write bytes: a checkpoint is unpacked on the host once, at load
// (docs/design/cuda.md), into models/quantized_checkpoint.h's format-neutral
// QuantizedSlice, and the kernels build their runtime form from that. Errors
// name the checkpoint file and tensor: `Source`.
#include <string>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::io {

// Where an error says a tensor came from.
struct Source {
  std::string file, tensor;
};

// How values V [R, C] sit in int32 words: `per_word` (32 / bits) consecutive
// values along dim `packed_dim` share a word, value j of a word at bit slot
// slot(j) (AWQ interleaves: its slots are 0 4 1 5 2 6 3 7); the words are stored
// [R', C'] (R or C divided by per_word along packed_dim), or transposed [C', R'].
struct WordLayout {
  int bits = 4;
  int packed_dim = 1;
  bool transposed = false;
  bool awq_order = false;
  int per_word() const { return 32 / bits; }
};

// V [rows, cols] u8 from the words (i32, possibly unaligned: a view of the
// file's mapping), each value read from its word's bit slot.
Tensor unpack_words(const Tensor& words, const WordLayout& layout, int64_t rows, int64_t cols);
// V [rows, cols] with zero points: `add` added to each stored value (GPTQ v1
// stores z - 1); a sum over 255, or under `sym` one other than 2^(bits-1), is an error.
Tensor unpack_zero_points(const Tensor& words, const WordLayout& layout, int64_t rows, int add, bool sym,
                          const Source& source);
// The words (i32, zeros where no value falls) holding values [R, C] (u8), each
// stored as value - minus (GPTQ v1's zero points: z - 1).
Tensor pack_words(const Tensor& values, const WordLayout& layout, int minus = 0);

// Scales read as f32, checked finite, as [n, groups] (from [groups, n] when transposed).
Tensor scale_rows(const Tensor& scales, bool transposed, const Source& source);

// GPTQ's g_idx of the input features in `spans` (g holds just those, in order),
// checked to lie in [0, groups) and, without act-order, to be k / group_size
// (group_size -1: 0): i32 [the spans' total].
Tensor group_index(const Tensor& g, const std::vector<ChunkSpan>& spans, int64_t in_features, int64_t groups,
                   int64_t group_size, bool desc_act, const Source& source);

// An i64 or i32 (possibly unaligned) tensor's values.
std::vector<int64_t> stored_ints(const Tensor& t);

// W [n, k] f32 = scales[n, grp(k)] * (codes[n, k] - zeros[n, grp(k)]), grp(k) =
// g_idx[k] where defined, else k / group_size: codes u8 [n, k], scales f32 and
// zeros u8 [n, groups], g_idx i32 [k]. One f32 multiply per element.
Tensor dequantize_codes(const Tensor& codes, const Tensor& scales, const Tensor& zeros, const Tensor& g_idx,
                        int64_t group_size);

}  // namespace tp::io
