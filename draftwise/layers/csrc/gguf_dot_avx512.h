// gguf_linear's AVX512-VNNI path for repacked rows (Q4_0, Q4_1, Q8_0): a whole group's 128 codes
// are two 512-bit registers, units (0, 2) and (1, 3), dotted by vpdpbusd with the activations'
// matching 64 bytes (slot order, gguf_blocks.h). The int32 lanes are never reduced inside the
// loop: each is converted and scaled by its unit's weight scale times activation scale (the
// ActGroup's `lanes`) into per-row accumulators, which are summed once per output. A row's last,
// partial group runs on the AVX2 path (gguf_dot_avx2.h). Compiled where the CPU has AVX512-BW and
// AVX512-VNNI; DRAFTWISE_GGUF_ZMM says so.
#pragma once

#include "gguf_dot_avx2.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define DRAFTWISE_GGUF_ZMM 1

#include <immintrin.h>

namespace draftwise_gguf {

constexpr int64_t kZmmTile = 4;  // activation rows per pass over a weight row (two accumulators each)

template <int64_t T>
inline void zmm_group(const uint8_t* p, __m512i* lo, __m512i* hi, __m512* scale_lo, __m512* scale_hi,
                      __m256* offset) {
  if (T == kQ8_0) {  // signed codes biased to 0..255; the bias joins the offset
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    *lo = _mm512_xor_si512(_mm512_loadu_si512(p), bias);
    *hi = _mm512_xor_si512(_mm512_loadu_si512(p + 64), bias);
  } else {
    const __m512i raw = _mm512_loadu_si512(p), mask = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(raw, mask);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
  }
  const uint8_t* meta = p + (T == kQ8_0 ? kGroup * kUnit : 2 * kUnit);
  const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta)));  // units 0-3
  const __m512 d = _mm512_castps128_ps512(d4);
  *scale_lo = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), d);
  *scale_hi = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), d);
  __m128 m4;
  if (T == kQ4_1) {
    m4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta + 2 * kGroup)));
  } else {
    m4 = _mm_mul_ps(d4, _mm_set1_ps(T == kQ4_0 ? -8.f : -128.f));
  }
  *offset = _mm256_set_m128(m4, m4);  // ActGroup's ds lanes: half * 4 + unit
}

// out[m] = dot of repacked weight row `row` with activation rows act + m * num_groups, m < rows
// (<= kZmmTile).
template <int64_t T>
void dot_tile_zmm(const uint8_t* row, int64_t num_units, const ActGroup* act, int64_t num_groups, int64_t rows,
                  float* out) {
  __m512 acc_lo[kZmmTile], acc_hi[kZmmTile];
  __m256 acc_rest[kZmmTile];
  for (int64_t m = 0; m < rows; ++m)
    acc_lo[m] = _mm512_setzero_ps(), acc_hi[m] = _mm512_setzero_ps(), acc_rest[m] = _mm256_setzero_ps();
  const int64_t whole = num_units / kGroup;
  for (int64_t g = 0; g < whole; ++g) {
    __m512i lo, hi;
    __m512 scale_lo, scale_hi;
    __m256 offset;
    zmm_group<T>(row + g * kGroup * Layout<T>::bytes, &lo, &hi, &scale_lo, &scale_hi, &offset);
    for (int64_t m = 0; m < rows; ++m) {
      const ActGroup& a = act[m * num_groups + g];
      const __m512i dot_lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(a.q[0]));
      const __m512i dot_hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_load_si512(a.q[2]));
      acc_lo[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_lo), _mm512_mul_ps(scale_lo, _mm512_load_ps(a.lanes[0])),
                                  acc_lo[m]);
      acc_hi[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_hi), _mm512_mul_ps(scale_hi, _mm512_load_ps(a.lanes[1])),
                                  acc_hi[m]);
      acc_rest[m] = _mm256_fmadd_ps(offset, _mm256_loadu_ps(a.ds), acc_rest[m]);
    }
  }
  if (whole < num_groups) group_tile<T, true>(row, whole, num_units, act, num_groups, rows, acc_rest);
  for (int64_t m = 0; m < rows; ++m)
    out[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc_lo[m], acc_hi[m])) + hsum(acc_rest[m]);
}

}  // namespace draftwise_gguf
#endif
