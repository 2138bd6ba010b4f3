// draftwise_cpu::gguf_linear: y = x W^T with W kept as a GGUF file stores it.
//
// W is [out_features, row_bytes] uint8: each row holds the blocks of one output feature exactly as
// ggml-common.h lays them out (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: blocks of 32; Q4_K, Q5_K, Q6_K:
// super-blocks of 256), or repacked once at load (gguf_blocks.h, gguf_interleave.h, gguf_interleave_k.h). The
// kernel walks a row in units of 32 weights; a unit is its block's codes u (unsigned; Q8_0's are
// signed bytes) with a scale and an offset per half of 16, so that w_i = scale * u_i + offset (Q4_0's
// -8 d, Q4_1's m, a k-quant's -dmin m, Q6_K's -32 d sc). Each activation row is quantized once per
// call to 8 bits per 32 values (gguf_act.h), and an output sums, per half unit, d * scale * (integer
// dot of u and q) + offset * d * sum(q). One layout per ISA: where the CPU has AVX512-VNNI, weights of
// every type but Q5_1 whose outputs come in 16s are interleaved 16 rows at a time (gguf_interleave.h,
// gguf_interleave_k.h); everything else runs on the AVX2 path (gguf_dot_avx2.h) or scalar code (the
// library is built with -march=native on the machine that runs it).
//
// Threads split the output features. The unpacked weights of a group are used for a tile of
// activation rows, each with its own accumulators, so a verify step's few rows cost less than that
// many single rows. Every output depends only on its own activation row and weight row, summed in
// a fixed order: a row's result does not depend on how many rows share the call (batch invariance).
#include "gguf_linear.h"

#include "gguf_dot_avx2.h"
#include "gguf_interleave_k.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using namespace draftwise_gguf;

// Where outputs go: rows of `ld` values (the first out_features of each written), fp32 or bf16, plus
// an optional fp32 bias per feature.
struct Output {
  void* data;
  bool bf16;
  const float* bias;
  int64_t ld;

  void store(int64_t index, int64_t feature, float value) const {
    value += bias ? bias[feature] : 0.f;
    if (bf16) {
      static_cast<c10::BFloat16*>(data)[index] = c10::BFloat16(value);
    } else {
      static_cast<float*>(data)[index] = value;
    }
  }
};

#if defined(DRAFTWISE_GGUF_INTERLEAVED)
// The interleaved kernel of type T (dot_k_block for the k-quants, dot_block otherwise) on `rows` (1 ..
// kBlockRows) activation rows: each row count compiled on its own, so that its rows' accumulators
// stay in registers.
template <int64_t T>
void dot_interleaved(const uint8_t* block, int64_t num_units, const ActGroup* act, int64_t num_groups, int64_t rows,
                     float* out) {
  const auto with = [&]<int64_t R>() {
    if constexpr (is_k_quant<T>()) {
      dot_k_block<T, R>(block, num_units, act, num_groups, out, kBlockCols);
    } else {
      dot_block<T, R>(block, num_units, act, num_groups, out, kBlockCols);
    }
  };
  switch (rows) {
    case 1: return with.template operator()<1>();
    case 2: return with.template operator()<2>();
    case 3: return with.template operator()<3>();
    case 4: return with.template operator()<4>();
    case 5: return with.template operator()<5>();
    case 6: return with.template operator()<6>();
    case 7: return with.template operator()<7>();
    case 8: return with.template operator()<8>();
    default: return;  // run_interleaved passes 1 .. kBlockRows
  }
}

template <int64_t T>
void run_interleaved(const uint8_t* weight, int64_t out_features, int64_t num_units, const ActGroup* act,
                     int64_t num_rows, const Output& y) {
  const int64_t block_bytes = kBlockCols * num_units / Layout<T>::units * Layout<T>::bytes;
  const int64_t num_groups = (num_units + kGroup - 1) / kGroup;
  at::parallel_for(0, out_features / kBlockCols, 1, [&](int64_t begin, int64_t end) {
    float tile[kBlockRows * kBlockCols];
    for (int64_t b = begin; b < end; ++b)
      for (int64_t m0 = 0; m0 < num_rows; m0 += kBlockRows) {
        const int64_t rows = std::min(kBlockRows, num_rows - m0);
        dot_interleaved<T>(weight + b * block_bytes, num_units, act + m0 * num_groups, num_groups, rows, tile);
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t c = 0; c < kBlockCols; ++c) {
            const int64_t n = b * kBlockCols + c;
            y.store((m0 + m) * y.ld + n, n, tile[m * kBlockCols + c]);
          }
      }
  });
}
#endif

template <int64_t T, bool kPacked>
void run(const uint8_t* weight, int64_t out_features, int64_t num_units, const ActGroup* act, int64_t num_rows,
         const Output& y) {
#if defined(DRAFTWISE_GGUF_INTERLEAVED)
  if constexpr (kPacked) {
    if (interleaved<T>(out_features)) return run_interleaved<T>(weight, out_features, num_units, act, num_rows, y);
  }
#endif
  if constexpr (kPacked && is_k_quant<T>()) {  // not interleaved: gguf_repack kept the file's rows
    return run<T, false>(weight, out_features, num_units, act, num_rows, y);
  }
  const int64_t row_bytes = num_units / Layout<T>::units * Layout<T>::bytes;
  const int64_t num_groups = (num_units + kGroup - 1) / kGroup;
  at::parallel_for(0, out_features, 16, [&](int64_t begin, int64_t end) {
    float tile[kTile];
    for (int64_t n = begin; n < end; ++n)
      for (int64_t m0 = 0; m0 < num_rows; m0 += kTile) {
        const int64_t rows = std::min(kTile, num_rows - m0);
        dot_tile<T, kPacked>(weight + n * row_bytes, num_units, act + m0 * num_groups, num_groups, rows, tile);
        for (int64_t m = 0; m < rows; ++m) y.store((m0 + m) * y.ld + n, n, tile[m]);
      }
  });
}

template <int64_t T>
int64_t row_bytes_of(int64_t in_features) {
  const int64_t per_block = Layout<T>::units * kUnit;
  return in_features % per_block == 0 ? in_features / per_block * Layout<T>::bytes : -1;
}

// f.template operator()<T, kPacked>() for the type id and layout.
template <typename F>
void dispatch(int64_t qtype, bool packed, F&& f) {
  TORCH_CHECK(!packed || qtype != kQ5_1, "gguf_linear: GGUF type id ", qtype, " has no repacked layout");
  switch (packed ? -qtype : qtype) {
    case -kQ4_0: return f.template operator()<kQ4_0, true>();
    case -kQ4_1: return f.template operator()<kQ4_1, true>();
    case -kQ5_0: return f.template operator()<kQ5_0, true>();
    case -kQ8_0: return f.template operator()<kQ8_0, true>();
    case -kQ4_K: return f.template operator()<kQ4_K, true>();
    case -kQ5_K: return f.template operator()<kQ5_K, true>();
    case -kQ6_K: return f.template operator()<kQ6_K, true>();
    case kQ4_0: return f.template operator()<kQ4_0, false>();
    case kQ4_1: return f.template operator()<kQ4_1, false>();
    case kQ5_0: return f.template operator()<kQ5_0, false>();
    case kQ5_1: return f.template operator()<kQ5_1, false>();
    case kQ8_0: return f.template operator()<kQ8_0, false>();
    case kQ4_K: return f.template operator()<kQ4_K, false>();
    case kQ5_K: return f.template operator()<kQ5_K, false>();
    case kQ6_K: return f.template operator()<kQ6_K, false>();
    default: TORCH_CHECK(false, "gguf_linear: unsupported GGUF type id ", qtype);
  }
}

template <typename In>
void linear_into(const In* x, int64_t num_rows, int64_t in_features, const uint8_t* weight, int64_t out_features,
                 int64_t qtype, bool packed, const Output& y) {
  const int64_t num_units = in_features / kUnit, num_groups = (num_units + kGroup - 1) / kGroup;
  std::vector<ActGroup> act(num_rows * num_groups);
  quantize_rows(x, num_rows, in_features, num_groups, act.data());
  dispatch(qtype, packed, [&]<int64_t T, bool kPacked>() {
    run<T, kPacked>(weight, out_features, num_units, act.data(), num_rows, y);
  });
}

at::Tensor gguf_linear(const at::Tensor& x,       // [num_rows, in_features] float
                       const at::Tensor& weight,  // [out_features, row_bytes] uint8, GGUF blocks
                       int64_t qtype, bool packed, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && weight.scalar_type() == at::kByte, "gguf_linear: bad shapes");
  const bool bf16 = x.scalar_type() == at::kBFloat16;  // read and written as is; other dtypes via fp32
  const at::Tensor input = bf16 ? x.contiguous() : x.to(at::kFloat).contiguous();
  const at::Tensor w = weight.contiguous();
  const int64_t num_rows = input.size(0), in_features = input.size(1), out_features = w.size(0);
  check_weight(qtype, packed, in_features, w.size(1));
  at::Tensor out = at::empty({num_rows, out_features}, input.options());
  const at::Tensor bias_fp32 = bias.has_value() && bias->defined() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const Output y{out.data_ptr(), bf16, bias_fp32.defined() ? bias_fp32.data_ptr<float>() : nullptr, out_features};
  if (bf16) {
    linear_into(input.data_ptr<c10::BFloat16>(), num_rows, in_features, w.data_ptr<uint8_t>(), out_features, qtype,
                packed, y);
  } else {
    linear_into(input.data_ptr<float>(), num_rows, in_features, w.data_ptr<uint8_t>(), out_features, qtype, packed,
                y);
  }
  return x.scalar_type() == at::kFloat || bf16 ? out : out.to(x.scalar_type());
}

}  // namespace

namespace draftwise_gguf {

void check_weight(int64_t qtype, bool packed, int64_t in_features, int64_t row_bytes) {
  int64_t expected = -1;
  dispatch(qtype, packed, [&]<int64_t T, bool kPacked>() { expected = row_bytes_of<T>(in_features); });
  TORCH_CHECK(expected == row_bytes, "gguf_linear: weight rows of ", row_bytes, " bytes do not hold ", in_features,
              " weights of type ", qtype);
}

void linear_f32(const float* x, int64_t num_rows, int64_t in_features, const uint8_t* weight, int64_t out_features,
                int64_t qtype, bool packed, const float* bias, float* y, int64_t ldy) {
  linear_into(x, num_rows, in_features, weight, out_features, qtype, packed, Output{y, false, bias, ldy});
}

}  // namespace draftwise_gguf

TORCH_LIBRARY_FRAGMENT(draftwise_cpu, m) {
  m.def("gguf_linear(Tensor x, Tensor weight, int qtype, bool packed, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftwise_cpu, CPU, m) { m.impl("gguf_linear", gguf_linear); }
