// draftwise_cpu::gguf_linear: y = x W^T with W kept as a GGUF file stores it.
//
// W is [out_features, row_bytes] uint8: each row holds the blocks of one output feature exactly as
// ggml-common.h lays them out (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: blocks of 32; Q4_K, Q5_K, Q6_K:
// super-blocks of 256). The kernel walks a row in units of 32 weights; `unpack<T>` turns one unit into 32 signed
// bytes q, a per-16 scale and an offset, so that w_i = scale(i / 16) * q_i + offset. Each
// activation row is quantized once per call to 8 bits per 32 (d = max|x| / 127, q = round(x / d),
// as llama.cpp's Q8_0), and an output is the sum over units of d_x * (scale-weighted integer
// dot) + offset * d_x * sum(q_x). The integer dot is vpdpbusd where the CPU has AVX-VNNI or
// AVX512-VNNI, vpmaddubsw + vpmaddwd on AVX2 (the library is built with -march=native on the
// machine that runs it), scalar code elsewhere.
//
// Threads split the output features. A unpacked weight unit is used for up to kTile activation
// rows, each with its own accumulators, so a verify step's few rows cost about what one row
// costs. Every output depends only on its own activation row and weight row, summed in a fixed
// order: a row's result does not depend on how many rows share the call (batch invariance).
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

constexpr int64_t kUnit = 32;
constexpr int64_t kTile = 8;  // activation rows sharing each unpacked weight unit
enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

struct ActUnit {  // 32 activations, quantized
  int8_t q[kUnit];
  float d;   // scale
  float ds;  // d * sum(q): what the unit's weight offset multiplies
};

// One unit of weights: w_i = scale[i / 16] * q[i] + offset.
struct WeightUnit {
  int8_t q[kUnit];
  float scale[2];
  float offset;
};

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

template <int64_t T> struct Layout;  // bytes per block and units (of 32 weights) per block
template <> struct Layout<kQ4_0> { static constexpr int64_t bytes = 18, units = 1; };
template <> struct Layout<kQ4_1> { static constexpr int64_t bytes = 20, units = 1; };
template <> struct Layout<kQ5_0> { static constexpr int64_t bytes = 22, units = 1; };
template <> struct Layout<kQ5_1> { static constexpr int64_t bytes = 24, units = 1; };
template <> struct Layout<kQ8_0> { static constexpr int64_t bytes = 34, units = 1; };
template <> struct Layout<kQ4_K> { static constexpr int64_t bytes = 144, units = 8; };
template <> struct Layout<kQ5_K> { static constexpr int64_t bytes = 176, units = 8; };
template <> struct Layout<kQ6_K> { static constexpr int64_t bytes = 210, units = 8; };

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes.
inline void scale_min_k4(int64_t j, const uint8_t* q, float* sc, float* m) {
  if (j < 4) {
    *sc = q[j] & 63, *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The weights of unit `u` of a row, scalar (the reference the SIMD loads below follow).
template <int64_t T>
void unpack(const uint8_t* row, int64_t u, WeightUnit* w) {
  const uint8_t* b = row + (u / Layout<T>::units) * Layout<T>::bytes;
  const int64_t s = u % Layout<T>::units;  // unit within its block
  if (T == kQ4_0 || T == kQ4_1) {
    const uint8_t* qs = b + (T == kQ4_1 ? 4 : 2);
    const int bias = T == kQ4_0 ? 8 : 0;
    for (int i = 0; i < 16; ++i) w->q[i] = (qs[i] & 0xF) - bias, w->q[i + 16] = (qs[i] >> 4) - bias;
    w->scale[0] = w->scale[1] = half_at(b);
    w->offset = T == kQ4_1 ? half_at(b + 2) : 0.f;
  } else if (T == kQ5_0 || T == kQ5_1) {  // d, (m,) 32 fifth bits, 16 bytes of nibbles
    const uint8_t* qs = b + (T == kQ5_1 ? 8 : 6);
    uint32_t high;
    std::memcpy(&high, b + (T == kQ5_1 ? 4 : 2), 4);
    const int bias = T == kQ5_0 ? 16 : 0;
    for (int i = 0; i < 16; ++i) {
      w->q[i] = ((qs[i] & 0xF) | (((high >> i) & 1) << 4)) - bias;
      w->q[i + 16] = ((qs[i] >> 4) | (((high >> (i + 16)) & 1) << 4)) - bias;
    }
    w->scale[0] = w->scale[1] = half_at(b);
    w->offset = T == kQ5_1 ? half_at(b + 2) : 0.f;
  } else if (T == kQ8_0) {
    std::memcpy(w->q, b + 2, kUnit);
    w->scale[0] = w->scale[1] = half_at(b);
    w->offset = 0.f;
  } else if (T == kQ4_K || T == kQ5_K) {
    const uint8_t* qs = b + (T == kQ5_K ? 48 : 16) + (s / 2) * 32;
    const int shift = (s % 2) * 4;
    for (int i = 0; i < kUnit; ++i) {
      int q = (qs[i] >> shift) & 0xF;
      if (T == kQ5_K) q |= ((b[16 + i] >> s) & 1) << 4;
      w->q[i] = static_cast<int8_t>(q);
    }
    float sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    w->scale[0] = w->scale[1] = half_at(b) * sc;
    w->offset = -half_at(b + 2) * m;
  } else {  // Q6_K: ql[128], qh[64], scales[16] int8, d
    const int64_t h = s / 4, k = s % 4;
    const uint8_t* ql = b + 64 * h + (k & 1) * 32;
    const uint8_t* qh = b + 128 + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * k;
    for (int i = 0; i < kUnit; ++i) {
      const int low = k >= 2 ? ql[i] >> 4 : ql[i] & 0xF;
      w->q[i] = static_cast<int8_t>((low | (((qh[i] >> (2 * k)) & 3) << 4)) - 32);
    }
    const float d = half_at(b + 208);
    w->scale[0] = d * sc[0], w->scale[1] = d * sc[1];
    w->offset = 0.f;
  }
}

void quantize_rows(const float* x, int64_t num_rows, int64_t in_features, ActUnit* out) {
  const int64_t num_units = in_features / kUnit;
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t u = 0; u < num_units; ++u) {
      const float* src = x + r * in_features + u * kUnit;
      float amax = 0.f;
      for (int64_t i = 0; i < kUnit; ++i) amax = std::max(amax, std::fabs(src[i]));
      ActUnit& dst = out[r * num_units + u];
      dst.d = amax / 127.f;
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t sum = 0;
      for (int64_t i = 0; i < kUnit; ++i) {
        dst.q[i] = static_cast<int8_t>(std::nearbyint(src[i] * inv));
        sum += dst.q[i];
      }
      dst.ds = dst.d * static_cast<float>(sum);
    }
}

#if defined(__AVX2__)
inline __m256i nibbles(const uint8_t* p16) {  // 16 bytes -> low nibbles (0-15), then high (16-31)
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p16));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
}

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline __m256i bits_to_bytes(const uint8_t* p4) {  // 32 bits -> 32 bytes, 0xFF where the bit is set
  uint32_t bits;
  std::memcpy(&bits, p4, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                               0x0101010101010101, 0x0000000000000000));
  const __m256i others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1));
}

// unpack<T> in registers: q as 32 signed bytes, the per-lane scale (lanes 0-3: weights 0-15).
template <int64_t T>
inline __m256i unpack_simd(const uint8_t* row, int64_t u, __m256* scale, float* offset) {
  const uint8_t* b = row + (u / Layout<T>::units) * Layout<T>::bytes;
  const int64_t s = u % Layout<T>::units;
  const __m256i mask4 = _mm256_set1_epi8(0x0F);
  if (T == kQ4_0 || T == kQ4_1 || T == kQ8_0) {
    *scale = _mm256_set1_ps(half_at(b));
    *offset = T == kQ4_1 ? half_at(b + 2) : 0.f;
    if (T == kQ8_0) return load32(b + 2);
    const __m256i q = nibbles(b + (T == kQ4_1 ? 4 : 2));
    return T == kQ4_0 ? _mm256_sub_epi8(q, _mm256_set1_epi8(8)) : q;
  }
  if (T == kQ5_0 || T == kQ5_1) {
    *scale = _mm256_set1_ps(half_at(b));
    *offset = T == kQ5_1 ? half_at(b + 2) : 0.f;
    const __m256i high = _mm256_and_si256(bits_to_bytes(b + (T == kQ5_1 ? 4 : 2)), _mm256_set1_epi8(16));
    const __m256i q = _mm256_or_si256(nibbles(b + (T == kQ5_1 ? 8 : 6)), high);
    return T == kQ5_0 ? _mm256_sub_epi8(q, _mm256_set1_epi8(16)) : q;
  }
  if (T == kQ4_K || T == kQ5_K) {
    float sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    *scale = _mm256_set1_ps(half_at(b) * sc);
    *offset = -half_at(b + 2) * m;
    const __m256i raw = load32(b + (T == kQ5_K ? 48 : 16) + (s / 2) * 32);
    __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw, (s % 2) * 4), mask4);
    if (T == kQ5_K) {
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(load32(b + 16), s), _mm256_set1_epi8(1));
      q = _mm256_or_si256(q, _mm256_slli_epi16(high, 4));
    }
    return q;
  }
  const int64_t h = s / 4, k = s % 4;  // Q6_K
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * k;
  const float d = half_at(b + 208);
  *scale = _mm256_setr_m128(_mm_set1_ps(d * sc[0]), _mm_set1_ps(d * sc[1]));
  *offset = 0.f;
  const __m256i ql = load32(b + 64 * h + (k & 1) * 32);
  const __m256i low = _mm256_and_si256(_mm256_srli_epi16(ql, k >= 2 ? 4 : 0), mask4);
  const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(load32(b + 128 + 32 * h), 2 * k), _mm256_set1_epi8(3));
  return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(qh, 4)), _mm256_set1_epi8(32));
}

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

// out[m] = dot of weight row `row` with activation rows act + m * num_units, m < rows (<= kTile).
template <int64_t T>
void dot_tile(const uint8_t* row, int64_t num_units, const ActUnit* act, int64_t rows, float* out) {
  __m256 acc[kTile];
  float offset[kTile];
  for (int64_t m = 0; m < rows; ++m) acc[m] = _mm256_setzero_ps(), offset[m] = 0.f;
  for (int64_t u = 0; u < num_units; ++u) {
    __m256 scale;
    float unit_offset;
    const __m256i wq = unpack_simd<T>(row, u, &scale, &unit_offset);
    const __m256i wabs = _mm256_sign_epi8(wq, wq);
    for (int64_t m = 0; m < rows; ++m) {
      const ActUnit& a = act[m * num_units + u];
      const __m256i aq = _mm256_sign_epi8(load32(reinterpret_cast<const uint8_t*>(a.q)), wq);  // |w| x sign(w) a
      const __m256 dots = _mm256_cvtepi32_ps(dot_u8_s8(wabs, aq));
      acc[m] = _mm256_fmadd_ps(dots, _mm256_mul_ps(scale, _mm256_set1_ps(a.d)), acc[m]);
      offset[m] += unit_offset * a.ds;
    }
  }
  for (int64_t m = 0; m < rows; ++m) out[m] = hsum(acc[m]) + offset[m];
}
#else
template <int64_t T>
void dot_tile(const uint8_t* row, int64_t num_units, const ActUnit* act, int64_t rows, float* out) {
  for (int64_t m = 0; m < rows; ++m) out[m] = 0.f;
  WeightUnit w;
  for (int64_t u = 0; u < num_units; ++u) {
    unpack<T>(row, u, &w);
    for (int64_t m = 0; m < rows; ++m) {
      const ActUnit& a = act[m * num_units + u];
      int32_t dot[2] = {0, 0};
      for (int64_t i = 0; i < kUnit; ++i) dot[i / 16] += w.q[i] * a.q[i];
      out[m] += a.d * (w.scale[0] * dot[0] + w.scale[1] * dot[1]) + w.offset * a.ds;
    }
  }
}
#endif

template <int64_t T>
void run(const uint8_t* weight, int64_t out_features, int64_t num_units, const ActUnit* act, int64_t num_rows,
         float* y) {
  const int64_t row_bytes = num_units / Layout<T>::units * Layout<T>::bytes;
  at::parallel_for(0, out_features, 16, [&](int64_t begin, int64_t end) {
    float tile[kTile];
    for (int64_t n = begin; n < end; ++n)
      for (int64_t m0 = 0; m0 < num_rows; m0 += kTile) {
        const int64_t rows = std::min(kTile, num_rows - m0);
        dot_tile<T>(weight + n * row_bytes, num_units, act + m0 * num_units, rows, tile);
        for (int64_t m = 0; m < rows; ++m) y[(m0 + m) * out_features + n] = tile[m];
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
                       int64_t qtype, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && weight.scalar_type() == at::kByte, "gguf_linear: bad shapes");
  const at::Tensor input = x.to(at::kFloat).contiguous();
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
  const int64_t num_units = in_features / kUnit;
  std::vector<ActUnit> act(num_rows * num_units);
  quantize_rows(input.data_ptr<float>(), num_rows, in_features, act.data());
  at::Tensor out = at::empty({num_rows, out_features}, input.options());
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* y = out.data_ptr<float>();
  switch (qtype) {
    case kQ4_0: run<kQ4_0>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ4_1: run<kQ4_1>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ5_0: run<kQ5_0>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ5_1: run<kQ5_1>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ8_0: run<kQ8_0>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ4_K: run<kQ4_K>(wp, out_features, num_units, act.data(), num_rows, y); break;
    case kQ5_K: run<kQ5_K>(wp, out_features, num_units, act.data(), num_rows, y); break;
    default: run<kQ6_K>(wp, out_features, num_units, act.data(), num_rows, y); break;
  }
  if (bias.has_value() && bias->defined()) out.add_(bias->to(at::kFloat));
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftwise_cpu, m) {
  m.def("gguf_linear(Tensor x, Tensor weight, int qtype, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftwise_cpu, CPU, m) { m.impl("gguf_linear", gguf_linear); }
