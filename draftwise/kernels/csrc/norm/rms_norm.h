// One row of RMSNorm, shared by the draftwise_cpu::rms_norm op (rms_norm.cpp) and the decoder
// stack (stack/decoder_stack.cpp), so a norm gives the same bits on either path.
#pragma once

#include <cmath>
#include <cstdint>

namespace draftwise_cpu_kernels {

// out = x * rsqrt(mean(x^2) + eps) * w over one row of `dim` fp32 values (out may be x).
inline void rms_norm_row(const float* x, int64_t dim, const float* w, float eps, float* out) {
  float sum = 0.f;
  for (int64_t d = 0; d < dim; ++d) sum += x[d] * x[d];
  const float scale = 1.f / std::sqrt(sum / static_cast<float>(dim) + eps);
  for (int64_t d = 0; d < dim; ++d) out[d] = x[d] * scale * w[d];
}

}  // namespace draftwise_cpu_kernels
