// draftwise_cpu::rms_norm: x * rsqrt(mean(x^2) + eps) * weight over the last dim of fp32 rows, one
// call instead of torch's five ops (pow, mean, add, rsqrt, mul), which dominate the norm's time at a
// few rows. Each row is computed by rms_norm_row (rms_norm.h), which the decoder stack shares.
#include "rms_norm.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

namespace {

at::Tensor rms_norm_cpu(const at::Tensor& x,       // [..., dim] float32
                        const at::Tensor& weight,  // [dim] float32
                        double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "rms_norm takes float32");
  auto input = x.contiguous();
  const int64_t dim = input.size(-1), num_rows = input.numel() / dim;
  TORCH_CHECK(weight.numel() == dim, "rms_norm: weight size ", weight.numel(), " != ", dim);
  at::Tensor out = at::empty_like(input);
  const float* src = input.data_ptr<float>();
  const float* w = weight.contiguous().data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, num_rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      draftwise_cpu_kernels::rms_norm_row(src + r * dim, dim, w, static_cast<float>(eps), dst + r * dim);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftwise_cpu, m) { m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"); }

TORCH_LIBRARY_IMPL(draftwise_cpu, CPU, m) { m.impl("rms_norm", &rms_norm_cpu); }
