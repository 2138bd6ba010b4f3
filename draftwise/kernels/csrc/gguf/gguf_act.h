// Activations as gguf_linear's integer dots read them: each row quantized to 8 bits per unit of 32
// values (d = max|x| / 127, q = round(x / d), as llama.cpp's Q8_0), kGroup units to an ActGroup.
#pragma once

#include "gguf_blocks.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace draftwise_gguf {

// kGroup units of one activation row. `q` holds the units in slot order (kSlot). Lane k of `d` /
// `ds` belongs to half k / kGroup (values 0-15 or 16-31) of unit k % kGroup: d = the unit's scale,
// ds = d * sum(q) over the half.
struct alignas(64) ActGroup {
  int8_t q[kGroup][kUnit];
  float d[2 * kGroup];
  float ds[2 * kGroup];
};

// One unit: q[i] = round(src[i] * 127 / max|src|) (ties to even), sum[h] = the sum of half h's q;
// returns max|src|.
inline float quantize_unit(const float* src, int8_t* q, int32_t* sum) {
#if defined(__AVX2__)
  __m256 v[4];
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(src + 8 * i);
  const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                                 _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m256i qi[4];
  for (int i = 0; i < 4; ++i)
    qi[i] = _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(v[i], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  for (int h = 0; h < 2; ++h) {
    const __m256i s8 = _mm256_add_epi32(qi[2 * h], qi[2 * h + 1]);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    sum[h] = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
  }
  return amax;
#else
  float amax = 0.f;
  for (int64_t i = 0; i < kUnit; ++i) amax = std::max(amax, std::fabs(src[i]));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  sum[0] = sum[1] = 0;
  for (int64_t i = 0; i < kUnit; ++i) {
    q[i] = static_cast<int8_t>(std::nearbyint(src[i] * inv));
    sum[i / 16] += q[i];
  }
  return amax;
#endif
}

// Rows [num_rows, in_features] to num_rows * num_groups groups; units past a row's end are zero.
template <typename In>  // float or c10::BFloat16
void quantize_rows(const In* x, int64_t num_rows, int64_t in_features, int64_t num_groups, ActGroup* out) {
  std::memset(static_cast<void*>(out), 0, sizeof(ActGroup) * num_rows * num_groups);
  const int64_t num_units = in_features / kUnit;
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t u = 0; u < num_units; ++u) {
      float buffer[kUnit];
      const float* src = reinterpret_cast<const float*>(x + r * in_features + u * kUnit);
      if constexpr (!std::is_same_v<In, float>) {
        for (int64_t i = 0; i < kUnit; ++i) buffer[i] = static_cast<float>(x[r * in_features + u * kUnit + i]);
        src = buffer;
      }
      ActGroup& g = out[r * num_groups + u / kGroup];
      const int64_t j = u % kGroup;
      int32_t sum[2];
      const float d = quantize_unit(src, g.q[kSlot[j]], sum) / 127.f;
      for (int h = 0; h < 2; ++h) g.d[h * kGroup + j] = d, g.ds[h * kGroup + j] = d * static_cast<float>(sum[h]);
    }
}

}  // namespace draftwise_gguf
