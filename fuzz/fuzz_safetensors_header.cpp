// libFuzzer target for the safetensors header parser: any byte string must give
// either a validated header or a tp::Error, never a crash, a hang or another
// exception. An accepted header must keep its promises (checked below), since
// the reader trusts them to index the mapped file.
#include <cstdint>
#include <cstdlib>

#include "tp/io/safetensors_header.h"
#include "tp/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tp::io::SafetensorsHeader h;
  try {
    h = tp::io::parse_safetensors_header(data, size, "fuzz.safetensors");
  } catch (const tp::Error&) {
    return 0;
  }
  if (h.data_offset + h.data_size != size) std::abort();
  size_t prev_end = 0;
  for (const tp::io::TensorInfo& t : h.tensors) {
    if (t.data_begin + t.nbytes > h.data_size) std::abort();
    if (static_cast<size_t>(tp::numel(t.shape)) * tp::dtype_size(t.dtype) != t.nbytes) std::abort();
    if (t.nbytes == 0) continue;
    if (t.data_begin < prev_end) std::abort();  // overlap slipped through
    prev_end = t.data_begin + t.nbytes;
    // ASan checks that the whole span is readable.
    volatile uint8_t first = data[h.data_offset + t.data_begin];
    volatile uint8_t last = data[h.data_offset + t.data_begin + t.nbytes - 1];
    (void)first;
    (void)last;
  }
  return 0;
}
