// draftwise_cpu::rms_norm and draftwise_cpu::packed_linear (the library's other ops register
// themselves from their own files as fragments of this library).
#include "rms_norm.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace {

// x * rsqrt(mean(x^2) + eps) * weight over the last dim of fp32 rows: one call instead of torch's
// five ops (pow, mean, add, rsqrt, mul), which dominate the norm's time at a few rows.
at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
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

// A PackedLinear's oneDNN kernel (mkldnn::_linear_pointwise on its prepacked weight) as an op of this
// library: a compiled graph's C++ wrapper calls it directly, with no Python call per linear.
at::Tensor packed_linear_cpu(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  static const c10::OperatorHandle linear =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack{x, packed, bias, c10::IValue(std::string("none")),
                                 c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string(""))};
  linear.callBoxed(&stack);
  return stack[0].toTensor();
}

}  // namespace

TORCH_LIBRARY(draftwise_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.impl("rms_norm", c10::DispatchKey::CPU, &rms_norm_cpu);
  m.def("packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.impl("packed_linear", c10::DispatchKey::CPU, &packed_linear_cpu);
  m.impl("packed_linear", c10::DispatchKey::MkldnnCPU, &packed_linear_cpu);
}
