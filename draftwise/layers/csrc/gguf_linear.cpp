// draftwise_cpu::gguf_linear: y = x W^T with W kept as a GGUF file stores it.
//
// W is [out_features, row_bytes] uint8: each row holds the blocks of one output feature exactly as
// ggml-common.h lays them out (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: blocks of 32; Q4_K, Q5_K, Q6_K:
// super-blocks of 256). The kernel walks a row in units of 32 weights; a unit is its block's codes
// u (unsigned; Q8_0's are signed bytes) with a scale and an offset per half of 16, so that
// w_i = scale * u_i + offset (Q4_0's -8 d, Q4_1's m, a k-quant's -dmin m, Q6_K's -32 d sc). Each
// activation row is quantized once per call to 8 bits per 32 values (d = max|x| / 127, q =
// round(x / d), as llama.cpp's Q8_0), and an output sums, per half unit, d * scale * (integer dot
// of u and q) + offset * d * sum(q). The integer dots are vpdpbusd where the CPU has AVX-VNNI or
// AVX512-VNNI, vpmaddubsw + vpmaddwd on AVX2 (the library is built with -march=native on the
// machine that runs it), scalar code elsewhere; the dots of 4 units are reduced to their 8 half
// sums together and scaled in one vector operation.
//
// Threads split the output features. A group of unpacked weight units is used for up to kTile
// activation rows, each with its own accumulators, so a verify step's few rows cost less than that
// many single rows. Every output depends only on its own activation row and weight row, summed in
// a fixed order: a row's result does not depend on how many rows share the call (batch invariance).
#include "gguf_blocks.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

using namespace draftwise_gguf;

// kGroup units of one activation row, quantized. Lane k of `d` / `ds` belongs to half k / kGroup
// (values 0-15 or 16-31) of unit k % kGroup: d = the unit's scale, ds = d * sum(q) over the half.
struct ActGroup {
  int8_t q[kGroup][kUnit];
  float d[2 * kGroup];
  float ds[2 * kGroup];
};

// Each row to int8 per 32 values (d = max|x| / 127, q = round(x / d)), in groups; units past the
// row's end are zero.
template <typename In>  // float or c10::BFloat16
void quantize_rows(const In* x, int64_t num_rows, int64_t in_features, int64_t num_groups, ActGroup* out) {
  std::memset(out, 0, sizeof(ActGroup) * num_rows * num_groups);
  const int64_t num_units = in_features / kUnit;
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t u = 0; u < num_units; ++u) {
      float src[kUnit];
      for (int64_t i = 0; i < kUnit; ++i) src[i] = static_cast<float>(x[r * in_features + u * kUnit + i]);
      ActGroup& g = out[r * num_groups + u / kGroup];
      const int64_t j = u % kGroup;
      float amax = 0.f;
      for (int64_t i = 0; i < kUnit; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t sum[2] = {0, 0};
      for (int64_t i = 0; i < kUnit; ++i) {
        g.q[j][i] = static_cast<int8_t>(std::nearbyint(src[i] * inv));
        sum[i / 16] += g.q[j][i];
      }
      for (int h = 0; h < 2; ++h) g.d[h * kGroup + j] = d, g.ds[h * kGroup + j] = d * static_cast<float>(sum[h]);
    }
}

#if defined(__AVX2__)
inline short fp16_at(const uint8_t* p) {  // the raw bits of an fp16 at p
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<short>(bits);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline __m256i nibbles(const uint8_t* p16) {  // 16 bytes -> low nibbles (values 0-15), then high (16-31)
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p16));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
}

inline __m256i bits_to_bytes(const uint8_t* p4) {  // 32 bits -> 32 bytes, 0xFF where the bit is set
  uint32_t bits;
  std::memcpy(&bits, p4, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                               0x0101010101010101, 0x0000000000000000));
  const __m256i others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1));
}

// unpack<T>'s codes in a register.
template <int64_t T>
inline __m256i codes(const uint8_t* row, int64_t u) {
  const uint8_t* b = row + (u / Layout<T>::units) * Layout<T>::bytes;
  const int64_t s = u % Layout<T>::units;
  const __m256i mask4 = _mm256_set1_epi8(0x0F);
  if (T == kQ8_0) return load32(b + 2);
  if (T == kQ4_0 || T == kQ4_1) return nibbles(b + (T == kQ4_1 ? 4 : 2));
  if (T == kQ5_0 || T == kQ5_1) {
    const __m256i high = _mm256_and_si256(bits_to_bytes(b + (T == kQ5_1 ? 4 : 2)), _mm256_set1_epi8(16));
    return _mm256_or_si256(nibbles(b + (T == kQ5_1 ? 8 : 6)), high);
  }
  if (T == kQ4_K || T == kQ5_K) {
    const __m256i raw = load32(b + (T == kQ5_K ? 48 : 16) + (s / 2) * 32);
    const __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw, (s % 2) * 4), mask4);
    if (T == kQ4_K) return q;
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(load32(b + 16), s), _mm256_set1_epi8(1));
    return _mm256_or_si256(q, _mm256_slli_epi16(high, 4));
  }
  const int64_t h = s / 4, k = s % 4;  // Q6_K
  const __m256i low = _mm256_and_si256(_mm256_srli_epi16(load32(b + 64 * h + (k & 1) * 32), k >= 2 ? 4 : 0), mask4);
  const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(load32(b + 128 + 32 * h), 2 * k), _mm256_set1_epi8(3));
  return _mm256_or_si256(low, _mm256_slli_epi16(qh, 4));
}

#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
constexpr bool kVnni = true;  // vpdpbusd: no int16 intermediate, so Q8_0 codes may be biased to 0..255
#else
constexpr bool kVnni = false;
#endif

// Integer dot of 32 unsigned bytes with 32 signed bytes, as 8 int32 lanes (lane i: bytes 4i..4i+3).
inline __m256i dot_u8_s8(__m256i u, __m256i s) {
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 8 half-unit scales and offsets of a whole group g (lane layout as ActGroup's), in registers.
template <int64_t T>
inline void group_scales(const uint8_t* row, int64_t g, __m256* scale, __m256* offset) {
  const int64_t u0 = g * kGroup;
  const uint8_t* b = row + (u0 / Layout<T>::units) * Layout<T>::bytes;
  // Lanes are built from registers, never stored piecewise and reloaded whole (that defeats store forwarding).
  if (Layout<T>::units == 1) {  // one block per unit: its fp16 d (and m) at a fixed stride
    constexpr int64_t B = Layout<T>::bytes;
    const __m128 d4 = _mm_cvtph_ps(_mm_setr_epi16(fp16_at(b), fp16_at(b + B), fp16_at(b + 2 * B), fp16_at(b + 3 * B),
                                                  0, 0, 0, 0));
    *scale = _mm256_set_m128(d4, d4);
    if (T == kQ4_1 || T == kQ5_1) {
      const __m128 m4 = _mm_cvtph_ps(_mm_setr_epi16(fp16_at(b + 2), fp16_at(b + B + 2), fp16_at(b + 2 * B + 2),
                                                    fp16_at(b + 3 * B + 2), 0, 0, 0, 0));
      *offset = _mm256_set_m128(m4, m4);
    } else {
      *offset = _mm256_mul_ps(*scale, _mm256_set1_ps(T == kQ4_0 ? -8.f : T == kQ5_0 ? -16.f : 0.f));
    }
    return;
  }
  const int64_t s0 = u0 % Layout<T>::units;  // 0 or 4: a group never straddles a super-block
  if (T == kQ6_K) {  // int8 scales, two per unit, in unit order: [u0h0 u0h1 u1h0 u1h1 ...]
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 192 + 8 * (s0 / 4)));
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
    const __m256 ordered = _mm256_permutevar8x32_ps(sc, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    *scale = _mm256_mul_ps(ordered, _mm256_set1_ps(half_at(b + 208)));
    *offset = _mm256_mul_ps(*scale, _mm256_set1_ps(-32.f));
    return;
  }
  float sc[kGroup], mn[kGroup];  // Q4_K / Q5_K: 6-bit scales and mins
  for (int64_t j = 0; j < kGroup; ++j) scale_min_k4(s0 + j, b + 4, &sc[j], &mn[j]);
  const __m128 sc4 = _mm_mul_ps(_mm_setr_ps(sc[0], sc[1], sc[2], sc[3]), _mm_set1_ps(half_at(b)));
  const __m128 mn4 = _mm_mul_ps(_mm_setr_ps(mn[0], mn[1], mn[2], mn[3]), _mm_set1_ps(-half_at(b + 2)));
  *scale = _mm256_set_m128(sc4, sc4);
  *offset = _mm256_set_m128(mn4, mn4);
}

// The same for a last group that holds fewer than kGroup units (zeros past the row's end).
template <int64_t T>
inline void partial_group_scales(const uint8_t* row, int64_t g, int64_t num_units, __m256* scale, __m256* offset) {
  alignas(32) float sc[2 * kGroup] = {}, off[2 * kGroup] = {};
  for (int64_t u = g * kGroup; u < num_units; ++u) {
    float s2[2], o2[2];
    unit_scales<T>(row + (u / Layout<T>::units) * Layout<T>::bytes, u % Layout<T>::units, s2, o2);
    const int64_t j = u % kGroup;
    sc[j] = s2[0], sc[kGroup + j] = s2[1], off[j] = o2[0], off[kGroup + j] = o2[1];
  }
  *scale = _mm256_load_ps(sc), *offset = _mm256_load_ps(off);
}

// A whole group's codes and scales in the repacked layout (gguf_blocks.h).
template <int64_t T>
inline void packed_group(const uint8_t* p, __m256i* w, __m256* scale, __m256* offset) {
  const uint8_t* meta = p + (T == kQ8_0 ? kGroup * kUnit : 2 * kUnit);
  if (T == kQ8_0) {
    for (int64_t j = 0; j < kGroup; ++j) w[j] = load32(p + j * kUnit);
  } else {
    const __m256i mask4 = _mm256_set1_epi8(0x0F);
    for (int64_t pair = 0; pair < 2; ++pair) {
      const __m256i both = load32(p + pair * kUnit);
      w[2 * pair] = _mm256_and_si256(both, mask4);
      w[2 * pair + 1] = _mm256_and_si256(_mm256_srli_epi16(both, 4), mask4);
    }
  }
  if (T == kQ4_1) {  // [d0..d3 m0..m3]
    const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta)));
    *scale = _mm256_permute2f128_ps(dm, dm, 0x00);
    *offset = _mm256_permute2f128_ps(dm, dm, 0x11);
    return;
  }
  const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta)));
  *scale = _mm256_set_m128(d4, d4);
  *offset = _mm256_mul_ps(*scale, _mm256_set1_ps(T == kQ4_0 ? -8.f : 0.f));
}

// out[m] = dot of weight row `row` with activation rows act + m * num_groups, m < rows (<= kTile).
template <int64_t T, bool kPacked>
void dot_tile(const uint8_t* row, int64_t num_units, const ActGroup* act, int64_t num_groups, int64_t rows,
              float* out) {
  // Q8_0's signed codes: with VNNI biased by 128 (the bias joins the offset), else |w| x sign(w) a.
  constexpr bool kBiased = T == kQ8_0 && kVnni, kSigned = T == kQ8_0 && !kVnni;
  __m256 acc[kTile];
  for (int64_t m = 0; m < rows; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < num_groups; ++g) {
    __m256i w[kGroup], wabs[kGroup];
    __m256 scales, offsets;
    const bool whole = (g + 1) * kGroup <= num_units;
    if (kPacked && whole) {
      packed_group<T>(row + g * kGroup * Layout<T>::bytes, w, &scales, &offsets);
    } else {
      for (int64_t j = 0; j < kGroup; ++j) {
        const int64_t u = g * kGroup + j;
        w[j] = whole || u < num_units ? codes<T>(row, u) : _mm256_setzero_si256();
      }
      if (whole) {
        group_scales<T>(row, g, &scales, &offsets);
      } else {
        partial_group_scales<T>(row, g, num_units, &scales, &offsets);
      }
    }
    for (int64_t j = 0; j < kGroup; ++j) {
      if (kBiased) w[j] = _mm256_xor_si256(w[j], _mm256_set1_epi8(static_cast<char>(0x80)));  // q + 128
      wabs[j] = kSigned ? _mm256_sign_epi8(w[j], w[j]) : w[j];
    }
    if (kBiased) offsets = _mm256_mul_ps(scales, _mm256_set1_ps(-128.f));
    for (int64_t m = 0; m < rows; ++m) {
      const ActGroup& a = act[m * num_groups + g];
      __m256i dots[kGroup];
      for (int64_t j = 0; j < kGroup; ++j) {
        const __m256i aq = kSigned ? _mm256_sign_epi8(load32(a.q[j]), w[j]) : load32(a.q[j]);
        dots[j] = dot_u8_s8(wabs[j], aq);
      }
      // Lanes 0-3: the first halves of units 0-3; lanes 4-7: their second halves.
      const __m256i halves = _mm256_hadd_epi32(_mm256_hadd_epi32(dots[0], dots[1]), _mm256_hadd_epi32(dots[2], dots[3]));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(halves), _mm256_mul_ps(scales, _mm256_loadu_ps(a.d)), acc[m]);
      acc[m] = _mm256_fmadd_ps(offsets, _mm256_loadu_ps(a.ds), acc[m]);
    }
  }
  for (int64_t m = 0; m < rows; ++m) out[m] = hsum(acc[m]);
}
#else
template <int64_t T, bool kPacked>
void dot_tile(const uint8_t* row, int64_t num_units, const ActGroup* act, int64_t num_groups, int64_t rows,
              float* out) {
  for (int64_t m = 0; m < rows; ++m) out[m] = 0.f;
  WeightUnit w;
  for (int64_t u = 0; u < num_units; ++u) {
    if (kPacked && (u / kGroup + 1) * kGroup <= num_units) {
      unpack_repacked<T>(row, u, &w);
    } else {
      unpack<T>(row, u, &w);
    }
    const int64_t g = u / kGroup, j = u % kGroup;
    for (int64_t m = 0; m < rows; ++m) {
      const ActGroup& a = act[m * num_groups + g];
      int32_t dot[2] = {0, 0};
      for (int64_t i = 0; i < kUnit; ++i)
        dot[i / 16] += (T == kQ8_0 ? static_cast<int8_t>(w.u[i]) : static_cast<int32_t>(w.u[i])) * a.q[j][i];
      for (int h = 0; h < 2; ++h)
        out[m] += w.scale[h] * a.d[h * kGroup + j] * static_cast<float>(dot[h]) + w.offset[h] * a.ds[h * kGroup + j];
    }
  }
}
#endif

// Where outputs go: [num_rows, out_features] fp32 or bf16, plus an optional fp32 bias per feature.
struct Output {
  void* data;
  bool bf16;
  const float* bias;

  void store(int64_t index, int64_t feature, float value) const {
    value += bias ? bias[feature] : 0.f;
    if (bf16) {
      static_cast<c10::BFloat16*>(data)[index] = c10::BFloat16(value);
    } else {
      static_cast<float*>(data)[index] = value;
    }
  }
};

template <int64_t T, bool kPacked = false>
void run(const uint8_t* weight, int64_t out_features, int64_t num_units, const ActGroup* act, int64_t num_rows,
         const Output& y) {
  const int64_t row_bytes = num_units / Layout<T>::units * Layout<T>::bytes;
  const int64_t num_groups = (num_units + kGroup - 1) / kGroup;
  at::parallel_for(0, out_features, 16, [&](int64_t begin, int64_t end) {
    float tile[kTile];
    for (int64_t n = begin; n < end; ++n)
      for (int64_t m0 = 0; m0 < num_rows; m0 += kTile) {
        const int64_t rows = std::min(kTile, num_rows - m0);
        dot_tile<T, kPacked>(weight + n * row_bytes, num_units, act + m0 * num_groups, num_groups, rows, tile);
        for (int64_t m = 0; m < rows; ++m) y.store((m0 + m) * out_features + n, n, tile[m]);
      }
  });
}

template <int64_t T>
int64_t row_bytes_of(int64_t in_features) {
  const int64_t per_block = Layout<T>::units * kUnit;
  return in_features % per_block == 0 ? in_features / per_block * Layout<T>::bytes : -1;
}

at::Tensor gguf_linear(const at::Tensor& x,       // [num_rows, in_features] float
                       const at::Tensor& weight,  // [out_features, row_bytes] uint8, GGUF blocks
                       int64_t qtype, bool packed, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && weight.scalar_type() == at::kByte, "gguf_linear: bad shapes");
  const bool bf16 = x.scalar_type() == at::kBFloat16;  // read and written as is; other dtypes via fp32
  const at::Tensor input = bf16 ? x.contiguous() : x.to(at::kFloat).contiguous();
  const at::Tensor w = weight.contiguous();
  const int64_t num_rows = input.size(0), in_features = input.size(1), out_features = w.size(0);
  int64_t expected = -1;
  switch (qtype) {
    case kQ4_0: expected = row_bytes_of<kQ4_0>(in_features); break;
    case kQ4_1: expected = row_bytes_of<kQ4_1>(in_features); break;
    case kQ5_0: expected = row_bytes_of<kQ5_0>(in_features); break;
    case kQ5_1: expected = row_bytes_of<kQ5_1>(in_features); break;
    case kQ8_0: expected = row_bytes_of<kQ8_0>(in_features); break;
    case kQ4_K: expected = row_bytes_of<kQ4_K>(in_features); break;
    case kQ5_K: expected = row_bytes_of<kQ5_K>(in_features); break;
    case kQ6_K: expected = row_bytes_of<kQ6_K>(in_features); break;
    default: TORCH_CHECK(false, "gguf_linear: unsupported GGUF type id ", qtype);
  }
  TORCH_CHECK(expected == w.size(1), "gguf_linear: weight rows of ", w.size(1), " bytes do not hold ",
              in_features, " weights of type ", qtype);
  const int64_t num_units = in_features / kUnit, num_groups = (num_units + kGroup - 1) / kGroup;
  std::vector<ActGroup> act(num_rows * num_groups);
  if (bf16) {
    quantize_rows(input.data_ptr<c10::BFloat16>(), num_rows, in_features, num_groups, act.data());
  } else {
    quantize_rows(input.data_ptr<float>(), num_rows, in_features, num_groups, act.data());
  }
  at::Tensor out = at::empty({num_rows, out_features}, input.options());
  const at::Tensor bias_fp32 = bias.has_value() && bias->defined() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const Output y{out.data_ptr(), bf16, bias_fp32.defined() ? bias_fp32.data_ptr<float>() : nullptr};
  TORCH_CHECK(!packed || qtype == kQ4_0 || qtype == kQ4_1 || qtype == kQ8_0,
              "gguf_linear: GGUF type id ", qtype, " has no repacked layout");
  switch (packed ? -qtype : qtype) {
    case -kQ4_0: run<kQ4_0, true>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case -kQ4_1: run<kQ4_1, true>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case -kQ8_0: run<kQ8_0, true>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ4_0: run<kQ4_0>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ4_1: run<kQ4_1>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ5_0: run<kQ5_0>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ5_1: run<kQ5_1>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ8_0: run<kQ8_0>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ4_K: run<kQ4_K>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ5_K: run<kQ5_K>(wp, out_features, num_units, act.data(), num_rows, y); break;
    default: run<kQ6_K>(wp, out_features, num_units, act.data(), num_rows, y); break;
  }
  return x.scalar_type() == at::kFloat || bf16 ? out : out.to(x.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftwise_cpu, m) {
  m.def("gguf_linear(Tensor x, Tensor weight, int qtype, bool packed, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftwise_cpu, CPU, m) { m.impl("gguf_linear", gguf_linear); }
