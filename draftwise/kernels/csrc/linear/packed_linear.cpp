// draftwise_cpu::packed_linear: a PackedLinear's oneDNN kernel (mkldnn::_linear_pointwise on its
// prepacked weight) as an op of this library, so a compiled graph's C++ wrapper calls it directly,
// with no Python call per linear (layers/linear.py).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

namespace {

at::Tensor packed_linear_cpu(const at::Tensor& x,       // [num_rows, in_features]
                             const at::Tensor& packed,  // oneDNN-reordered [out_features, in_features]
                             const std::optional<at::Tensor>& bias) {
  static const c10::OperatorHandle linear =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack{x, packed, bias, c10::IValue(std::string("none")),
                                 c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string(""))};
  linear.callBoxed(&stack);
  return stack[0].toTensor();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftwise_cpu, m) { m.def("packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor"); }

TORCH_LIBRARY_IMPL(draftwise_cpu, CPU, m) { m.impl("packed_linear", &packed_linear_cpu); }

TORCH_LIBRARY_IMPL(draftwise_cpu, MkldnnCPU, m) { m.impl("packed_linear", &packed_linear_cpu); }
