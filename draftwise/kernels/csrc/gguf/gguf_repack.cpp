// draftwise_cpu::gguf_repack: a GGUF weight's rows in the repacked layout gguf_blocks.h describes
// (Q4_0, Q4_1, Q5_0, Q8_0), or interleaved 16 rows at a time where gguf_interleave.h's kernel runs
// them (the k-quants too, gguf_interleave_k.h; elsewhere they keep the file's layout), done once at load; gguf_linear reads them with `packed=True`. Same shape and
// bytes per row; the values the kernel computes from either layout are identical.
#include "gguf_blocks.h"
#include "gguf_interleave_k.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

namespace {

using namespace draftwise_gguf;

// n blocks of one unit each (kGroup, or a last pair) -> their repacked form (gguf_blocks.h).
template <int64_t T>
void repack_group(const uint8_t* src, int64_t n, uint8_t* dst) {
  constexpr int64_t bytes = Layout<T>::bytes;
  WeightUnit units[kGroup];
  for (int64_t j = 0; j < n; ++j) unpack<T>(src, j, &units[j]);
  if (T == kQ8_0) {
    for (int64_t j = 0; j < n; ++j) std::memcpy(dst + (n == kGroup ? kSlot[j] : j) * kUnit, src + j * bytes + 2, kUnit);
  } else {
    for (int64_t pair = 0; pair < n / 2; ++pair)
      for (int64_t i = 0; i < kUnit; ++i)
        dst[pair * kUnit + i] =
            static_cast<uint8_t>((units[2 * pair].u[i] & 0xF) | ((units[2 * pair + 1].u[i] & 0xF) << 4));
  }
  if (T == kQ5_0)  // whole groups only: the high bits' masks in slot order
    for (int64_t j = 0; j < n; ++j) std::memcpy(dst + 2 * kUnit + 4 * kSlot[j], src + j * bytes + 2, 4);
  uint8_t* meta = dst + (T == kQ8_0 ? n * kUnit : T == kQ5_0 ? 2 * kUnit + 4 * kGroup : n / 2 * kUnit);
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(meta + 2 * j, src + j * bytes, 2);                          // d
    if (T == kQ4_1) std::memcpy(meta + 2 * (n + j), src + j * bytes + 2, 2);  // m
  }
}

template <int64_t T>
void repack_rows(const uint8_t* w, uint8_t* out, int64_t rows, int64_t row_bytes);

template <int64_t T>
void repack(const uint8_t* w, uint8_t* out, int64_t rows, int64_t row_bytes) {
  const int64_t num_units = row_bytes / Layout<T>::bytes;
  if (interleaved<T>(rows)) {  // 16 rows side by side (gguf_interleave.h, gguf_interleave_k.h)
    at::parallel_for(0, rows / kBlockCols, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const uint8_t* src = w + b * kBlockCols * row_bytes;
        uint8_t* dst = out + b * kBlockCols * row_bytes;
        if constexpr (is_k_quant<T>()) {
          interleave_k_block<T>(src, row_bytes, num_units, dst);
        } else {
          interleave_block<T>(src, row_bytes, num_units, dst);
        }
      }
    });
    return;
  }
  if constexpr (!is_k_quant<T>()) repack_rows<T>(w, out, rows, row_bytes);
}

template <int64_t T>
void repack_rows(const uint8_t* w, uint8_t* out, int64_t rows, int64_t row_bytes) {
  const int64_t num_units = row_bytes / Layout<T>::bytes, group_bytes = kGroup * Layout<T>::bytes;
  const int64_t num_groups = num_units / kGroup, tail = repacked_units<T>(num_units) - num_groups * kGroup;
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* src = w + r * row_bytes;
      uint8_t* dst = out + r * row_bytes;
      std::memcpy(dst, src, row_bytes);  // a partial last group of 1 or 3 units keeps the file's layout
      for (int64_t g = 0; g < num_groups; ++g)
        repack_group<T>(src + g * group_bytes, kGroup, dst + g * group_bytes);
      if (tail > 0) repack_group<T>(src + num_groups * group_bytes, tail, dst + num_groups * group_bytes);
    }
  });
}

// The weight's rows in the layout gguf_linear reads with packed=True: written into `out` where given
// (the rows of a fused projection, part by part), else into a new tensor, or `weight` itself where
// that layout is the file's (a k-quant on a CPU without the interleaved kernel).
at::Tensor gguf_repack(const at::Tensor& weight,  // [rows, row_bytes] uint8, as the file stores them
                       int64_t qtype, const c10::optional<at::Tensor>& out_arg) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kByte, "gguf_repack: weight must be 2-D uint8");
  const at::Tensor w = weight.contiguous();
  const int64_t rows = w.size(0), row_bytes = w.size(1);
  const bool given = out_arg.has_value() && out_arg->defined();
  TORCH_CHECK(!given || (out_arg->sizes() == w.sizes() && out_arg->is_contiguous() &&
                         out_arg->scalar_type() == at::kByte), "gguf_repack: out must be a contiguous tensor like weight");
  const bool k_quant = qtype == kQ4_K || qtype == kQ5_K || qtype == kQ6_K;
  if (k_quant && !interleaved<kQ4_K>(rows)) return given ? out_arg->copy_(w) : w;  // the file's layout
  at::Tensor out = given ? *out_arg : at::empty_like(w);
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  switch (qtype) {
    case kQ4_0: repack<kQ4_0>(src, dst, rows, row_bytes); break;
    case kQ4_1: repack<kQ4_1>(src, dst, rows, row_bytes); break;
    case kQ5_0: repack<kQ5_0>(src, dst, rows, row_bytes); break;
    case kQ8_0: repack<kQ8_0>(src, dst, rows, row_bytes); break;
    case kQ4_K: repack<kQ4_K>(src, dst, rows, row_bytes); break;
    case kQ5_K: repack<kQ5_K>(src, dst, rows, row_bytes); break;
    case kQ6_K: repack<kQ6_K>(src, dst, rows, row_bytes); break;
    default: TORCH_CHECK(false, "gguf_repack: GGUF type id ", qtype, " has no repacked layout");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftwise_cpu, m) { m.def("gguf_repack(Tensor weight, int qtype, Tensor(a!)? out=None) -> Tensor"); }

TORCH_LIBRARY_IMPL(draftwise_cpu, CPU, m) { m.impl("gguf_repack", gguf_repack); }
