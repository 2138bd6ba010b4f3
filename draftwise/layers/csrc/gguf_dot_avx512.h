// gguf_linear's AVX512-VNNI path for repacked rows (Q4_0, Q4_1, Q5_0, Q8_0) and Q4_K rows as
// stored: a whole group's 128 codes are two 512-bit registers, units (0, 2) and (1, 3), dotted by
// vpdpbusd with the activations' matching 64 bytes (slot order, gguf_blocks.h). The int32 lanes
// are never reduced inside the loop: each is converted and scaled by its unit's weight scale times
// activation scale into per-row accumulators, which are summed once per output, in one order
// whichever kernel ran (reduce_output). One activation row runs four outputs at a time. A row's
// last, partial group is a repacked pair or runs on the AVX2 path (gguf_dot_avx2.h). Compiled where
// the CPU has AVX512-BW and AVX512-VNNI; DRAFTWISE_GGUF_ZMM says so.
#pragma once

#include "gguf_dot_avx2.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define DRAFTWISE_GGUF_ZMM 1

#include <immintrin.h>

namespace draftwise_gguf {

constexpr int64_t kZmmTile = 8;  // activation rows per pass over a weight row
constexpr int64_t kAhead = 16;   // one-row kernel: weight rows prefetched this far ahead

// Q4_K: the 4 scales and (negated) mins of units s0..s0+3 (s0 = 0 or 4) of super-block b.
inline void k4_scales(const uint8_t* b, int64_t s0, __m128* scale, __m128* offset) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, b + 4, 12);
  const uint32_t sc = s0 == 0 ? u[0] & kLow6 : (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  const uint32_t mn = s0 == 0 ? u[1] & kLow6 : ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const auto bytes = [](uint32_t v) {
    return _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(v))));
  };
  *scale = opaque(_mm_mul_ps(bytes(sc), _mm_set1_ps(half_at(b))));
  *offset = opaque(_mm_mul_ps(bytes(mn), _mm_set1_ps(-half_at(b + 2))));
}

// Where group g of a row starts: its repacked bytes, or (Q4_K) its super-block.
template <int64_t T>
inline const uint8_t* group_at(const uint8_t* row, int64_t g) {
  return T == kQ4_K ? row + (g / 2) * Layout<T>::bytes : row + g * kGroup * Layout<T>::bytes;
}

// Group g's codes as two registers, units (0, 2) and (1, 3), its 4 scales and its offsets as
// ActGroup's ds lanes (half * 4 + unit); p = group_at<T>(row, g).
template <int64_t T>
inline void zmm_group(const uint8_t* p, int64_t g, __m512i* lo, __m512i* hi, __m128* scale, __m256* offset) {
  if (T == kQ4_K) {
    const __m512i raw = _mm512_loadu_si512(p + 16 + (g % 2) * 64), mask = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(raw, mask);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
    __m128 mn4;
    k4_scales(p, (g % 2) * 4, scale, &mn4);
    *offset = _mm256_set_m128(mn4, mn4);
    return;
  }
  if (T == kQ8_0) {  // signed codes biased to 0..255; the bias joins the offset
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    *lo = _mm512_xor_si512(_mm512_loadu_si512(p), bias);
    *hi = _mm512_xor_si512(_mm512_loadu_si512(p + 64), bias);
  } else {
    const __m512i raw = _mm512_loadu_si512(p), mask = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(raw, mask);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
  }
  if (T == kQ5_0) {  // the high bits: one 64-bit mask per register, a byte per bit
    uint64_t bits[2];
    std::memcpy(bits, p + 2 * kUnit, 16);
    const __m512i sixteen = _mm512_set1_epi8(16);
    *lo = _mm512_or_si512(*lo, _mm512_and_si512(_mm512_movm_epi8(_cvtu64_mask64(bits[0])), sixteen));
    *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_movm_epi8(_cvtu64_mask64(bits[1])), sixteen));
  }
  const uint8_t* meta = p + (T == kQ8_0 ? kGroup * kUnit : T == kQ5_0 ? 2 * kUnit + 4 * kGroup : 2 * kUnit);
  const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta)));  // units 0-3
  *scale = d4;
  __m128 m4;
  if (T == kQ4_1) {
    m4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta + 2 * kGroup)));
  } else {
    m4 = opaque(_mm_mul_ps(d4, _mm_set1_ps(T == kQ4_0 ? -8.f : T == kQ5_0 ? -16.f : -128.f)));
  }
  *offset = _mm256_set_m128(m4, m4);  // ActGroup's ds lanes: half * 4 + unit
}

// One output's sum of its accumulators: ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) of
// r = low half + high half of acc, + rest: the order dot_rows4_zmm reduces four outputs in.
inline float reduce_output(__m512 acc, __m256 rest) {
  const __m256 r = _mm256_add_ps(_mm256_add_ps(_mm512_castps512_ps256(acc),
                                               _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))),
                                 rest);
  __m256 h = _mm256_hadd_ps(r, r);
  h = _mm256_hadd_ps(h, h);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

// A repacked row's last pair of units against activation group `a`, added to *acc (scaled dots,
// then the offsets against ActGroup's ds lanes, whose units 2 and 3 are zero). Vector operations
// only: scalar arithmetic may be reassociated differently where this is inlined (-ffast-math),
// and every path must sum a row's terms in one order.
template <int64_t T>
inline void pair_zmm(const uint8_t* p, const ActGroup& a, __m256* acc) {
  __m256i u0, u1;
  if (T == kQ8_0) {
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    u0 = _mm256_xor_si256(load32(p), bias), u1 = _mm256_xor_si256(load32(p + kUnit), bias);
  } else {
    const __m256i raw = load32(p), mask = _mm256_set1_epi8(0x0F);
    u0 = _mm256_and_si256(raw, mask), u1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
  }
  const uint8_t* meta = p + (T == kQ8_0 ? 2 * kUnit : kUnit);
  int32_t bits;
  std::memcpy(&bits, meta, 4);
  const __m128 d2 = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));  // d0 d1 0 0
  const __m128 both = _mm_mul_ps(d2, _mm_load_ps(a.d));     // per unit: d_w d_a
  const __m256i dot0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, load32(a.q[kSlot[0]]));
  const __m256i dot1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u1, load32(a.q[kSlot[1]]));
  *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot0), _mm256_broadcastss_ps(both), *acc);
  *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot1), _mm256_broadcastss_ps(_mm_shuffle_ps(both, both, 1)), *acc);
  __m128 m2;
  if (T == kQ4_1) {
    std::memcpy(&bits, meta + 4, 4);
    m2 = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
  } else {
    m2 = opaque(_mm_mul_ps(d2, _mm_set1_ps(T == kQ4_0 ? -8.f : T == kQ5_0 ? -16.f : -128.f)));
  }
  *acc = _mm256_fmadd_ps(_mm256_set_m128(m2, m2), _mm256_load_ps(a.ds), *acc);
}

// The last, partial group (index g) of a repacked row against activation groups `act`, into *acc
// (Q4_K rows have none: they hold whole super-blocks).
template <int64_t T>
inline void tail_zmm(const uint8_t* row, int64_t g, int64_t num_units, const ActGroup* act, int64_t num_groups,
                     __m256* acc) {
  if constexpr (T == kQ4_K) return;
  if (repacked_units<T>(num_units) == num_units) return pair_zmm<T>(row + g * kGroup * Layout<T>::bytes, act[g], acc);
  group_tile<T, true>(row, g, num_units, act, num_groups, 1, acc);
}

// out[k] = dot of the repacked weight rows row + k * row_bytes (k < 4) with one activation row:
// each activation load serves four outputs, and their sums are reduced together (each in the
// order of reduce_output, so a row's outputs do not depend on the path: batch invariance).
template <int64_t T>
void dot_rows4_zmm(const uint8_t* row, int64_t row_bytes, int64_t num_units, const ActGroup* act,
                   int64_t num_groups, float* out) {
  __m512 acc[4];
  __m256 rest[4];
  for (int k = 0; k < 4; ++k) acc[k] = _mm512_setzero_ps(), rest[k] = _mm256_setzero_ps();
  const __m512i to_lo = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i to_hi = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
  const int64_t whole = num_units / kGroup;
  for (int64_t g = 0; g < whole; ++g) {
    const ActGroup& a = act[g];
    const __m512i x_lo = _mm512_load_si512(a.q[0]), x_hi = _mm512_load_si512(a.q[2]);
    const __m128 da = _mm_load_ps(a.d);
    const __m256 ds = _mm256_load_ps(a.ds);
    for (int k = 0; k < 4; ++k) {
      __m512i lo, hi;
      __m128 scale;
      __m256 offset;
      const uint8_t* p = group_at<T>(row + k * row_bytes, g);
      _mm_prefetch(reinterpret_cast<const char*>(p + kAhead * row_bytes), _MM_HINT_T0);  // never faults
      _mm_prefetch(reinterpret_cast<const char*>(p + kAhead * row_bytes + 64), _MM_HINT_T0);
      zmm_group<T>(p, g, &lo, &hi, &scale, &offset);
      const __m512 both = _mm512_castps128_ps512(_mm_mul_ps(scale, da));
      acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x_lo)),
                               _mm512_permutexvar_ps(to_lo, both), acc[k]);
      acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, x_hi)),
                               _mm512_permutexvar_ps(to_hi, both), acc[k]);
      rest[k] = _mm256_fmadd_ps(offset, ds, rest[k]);
    }
  }
  if (whole < num_groups)
    for (int k = 0; k < 4; ++k) tail_zmm<T>(row + k * row_bytes, whole, num_units, act, num_groups, &rest[k]);
  __m256 r[4];
  for (int k = 0; k < 4; ++k)
    r[k] = _mm256_add_ps(_mm256_add_ps(_mm512_castps512_ps256(acc[k]),
                                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[k]), 1))),
                         rest[k]);
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(r[0], r[1]), _mm256_hadd_ps(r[2], r[3]));
  const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  _mm_storeu_ps(out, sums);
}

// out[m] = dot of repacked weight row `row` with activation rows act + m * num_groups, m < rows
// (<= kZmmTile).
template <int64_t T>
void dot_tile_zmm(const uint8_t* row, int64_t num_units, const ActGroup* act, int64_t num_groups, int64_t rows,
                  float* out) {
  __m512 acc[kZmmTile];
  __m256 acc_rest[kZmmTile];
  for (int64_t m = 0; m < rows; ++m) acc[m] = _mm512_setzero_ps(), acc_rest[m] = _mm256_setzero_ps();
  const __m512i to_lo = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i to_hi = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
  const int64_t whole = num_units / kGroup;
  for (int64_t g = 0; g < whole; ++g) {
    __m512i lo, hi;
    __m128 scale;
    __m256 offset;
    zmm_group<T>(group_at<T>(row, g), g, &lo, &hi, &scale, &offset);
    for (int64_t m = 0; m < rows; ++m) {
      const ActGroup& a = act[m * num_groups + g];
      const __m512 both = _mm512_castps128_ps512(_mm_mul_ps(scale, _mm_load_ps(a.d)));  // per unit: d_w d_a
      const __m512i dot_lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(a.q[0]));
      const __m512i dot_hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_load_si512(a.q[2]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_lo), _mm512_permutexvar_ps(to_lo, both), acc[m]);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_hi), _mm512_permutexvar_ps(to_hi, both), acc[m]);
      acc_rest[m] = _mm256_fmadd_ps(offset, _mm256_load_ps(a.ds), acc_rest[m]);
    }
  }
  if (whole < num_groups)
    for (int64_t m = 0; m < rows; ++m)
      tail_zmm<T>(row, whole, num_units, act + m * num_groups, num_groups, &acc_rest[m]);
  for (int64_t m = 0; m < rows; ++m) out[m] = reduce_output(acc[m], acc_rest[m]);
}

}  // namespace draftwise_gguf
#endif
