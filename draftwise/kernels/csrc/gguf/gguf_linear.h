// The C++ entry points of gguf_linear.cpp, for other kernels of this library (stack/decoder_stack.cpp):
// the same computation as the draftwise_cpu::gguf_linear op, on raw fp32 buffers.
#pragma once

#include <cstdint>

namespace draftwise_gguf {

// Throws (TORCH_CHECK) unless rows of `row_bytes` bytes hold `in_features` weights of `qtype` in
// the given layout (`packed`: repacked at load, gguf_blocks.h).
void check_weight(int64_t qtype, bool packed, int64_t in_features, int64_t row_bytes);

// y[m * ldy + n] = (x[num_rows, in_features] W^T)[m, n] (+ bias[n] where not null) for n <
// out_features, W the [out_features, row_bytes] blocks at `weight`.
void linear_f32(const float* x, int64_t num_rows, int64_t in_features, const uint8_t* weight, int64_t out_features,
                int64_t qtype, bool packed, const float* bias, float* y, int64_t ldy);

}  // namespace draftwise_gguf
