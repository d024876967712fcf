#pragma once
// Flush-to-zero and denormals-are-zero on this thread and the OpenMP pool. As a
// model learns, the probabilities of unlikely tokens underflow to denormals
// (e^-100 ~ 4e-44), and every GEMM and kernel that touches one takes a microcode
// assist: a small Llama's steps slowed by a quarter over 200 steps without it.
// Values below 1.2e-38 become 0, as on GPUs' default training path. The Trainer
// sets it for its run.

namespace tp::ops {

void flush_denormals_to_zero();

}  // namespace tp::ops
