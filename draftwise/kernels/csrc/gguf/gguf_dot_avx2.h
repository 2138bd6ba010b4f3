// gguf_linear's AVX2 path (and its scalar fallback): one weight row against up to kTile activation
// rows, 4 units (a group) at a time. A unit's codes are unpacked to 32 bytes in a 256-bit register;
// the integer dots are vpdpbusd where the CPU has AVX-VNNI or AVX512-VNNI, vpmaddubsw + vpmaddwd on
// AVX2; the dots of a group's 4 units are reduced to their 8 half sums together and scaled in one
// vector operation (lanes as ActGroup's d / ds). This path reads every GGUF type, repacked or not.
#pragma once

#include "gguf_act.h"

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace draftwise_gguf {
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
  const uint8_t* meta = p + (T == kQ8_0 ? kGroup * kUnit : T == kQ5_0 ? 2 * kUnit + 4 * kGroup : 2 * kUnit);
  if (T == kQ8_0) {
    for (int64_t j = 0; j < kGroup; ++j) w[j] = load32(p + kSlot[j] * kUnit);
  } else {
    const __m256i mask4 = _mm256_set1_epi8(0x0F);
    for (int64_t pair = 0; pair < 2; ++pair) {
      const __m256i both = load32(p + pair * kUnit);
      w[2 * pair] = _mm256_and_si256(both, mask4);
      w[2 * pair + 1] = _mm256_and_si256(_mm256_srli_epi16(both, 4), mask4);
    }
  }
  if (T == kQ5_0)
    for (int64_t j = 0; j < kGroup; ++j)
      w[j] = _mm256_or_si256(w[j], _mm256_and_si256(bits_to_bytes(p + 2 * kUnit + 4 * kSlot[j]), _mm256_set1_epi8(16)));
  if (T == kQ4_1) {  // [d0..d3 m0..m3]
    const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta)));
    *scale = _mm256_permute2f128_ps(dm, dm, 0x00);
    *offset = _mm256_permute2f128_ps(dm, dm, 0x11);
    return;
  }
  const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta)));
  *scale = _mm256_set_m128(d4, d4);
  *offset = _mm256_mul_ps(*scale, _mm256_set1_ps(T == kQ4_0 ? -8.f : T == kQ5_0 ? -16.f : 0.f));
}

// A row's last pair of units in the repacked layout, as a group whose units 2 and 3 are zero.
template <int64_t T>
inline void packed_pair(const uint8_t* p, __m256i* w, __m256* scale, __m256* offset) {
  const uint8_t* meta = p + (T == kQ8_0 ? 2 * kUnit : kUnit);
  if (T == kQ8_0) {
    w[0] = load32(p), w[1] = load32(p + kUnit);
  } else {
    const __m256i both = load32(p), mask4 = _mm256_set1_epi8(0x0F);
    w[0] = _mm256_and_si256(both, mask4);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(both, 4), mask4);
  }
  w[2] = w[3] = _mm256_setzero_si256();
  const __m128 d2 = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(meta)));  // d0 d1 0 0
  *scale = _mm256_set_m128(d2, d2);
  if (T == kQ4_1) {
    const __m128 m2 = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(meta + 4)));
    *offset = _mm256_set_m128(m2, m2);
  } else {
    *offset = _mm256_mul_ps(*scale, _mm256_set1_ps(T == kQ4_0 ? -8.f : 0.f));
  }
}

// Adds group g of weight row `row` dotted with activation rows act + m * num_groups (m < rows <=
// kTile) to acc[m], as 8 half-unit lanes.
template <int64_t T, bool kPacked>
inline void group_tile(const uint8_t* row, int64_t g, int64_t num_units, const ActGroup* act, int64_t num_groups,
                       int64_t rows, __m256* acc) {
  // Q8_0's signed codes: with VNNI biased by 128 (the bias joins the offset), else |w| x sign(w) a.
  constexpr bool kBiased = T == kQ8_0 && kVnni, kSigned = T == kQ8_0 && !kVnni;
  __m256i w[kGroup], wabs[kGroup];
  __m256 scales, offsets;
  const bool whole = (g + 1) * kGroup <= num_units;
  if (kPacked && whole) {
    packed_group<T>(row + g * kGroup * Layout<T>::bytes, w, &scales, &offsets);
  } else if (kPacked && repacked_units<T>(num_units) == num_units) {  // a last pair
    packed_pair<T>(row + g * kGroup * Layout<T>::bytes, w, &scales, &offsets);
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
      const __m256i aq = kSigned ? _mm256_sign_epi8(load32(a.q[kSlot[j]]), w[j]) : load32(a.q[kSlot[j]]);
      dots[j] = dot_u8_s8(wabs[j], aq);
    }
    // Lanes 0-3: the first halves of units 0-3; lanes 4-7: their second halves.
    const __m256i halves = _mm256_hadd_epi32(_mm256_hadd_epi32(dots[0], dots[1]), _mm256_hadd_epi32(dots[2], dots[3]));
    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(halves), _mm256_mul_ps(scales, _mm256_loadu_ps(a.d)), acc[m]);
    acc[m] = _mm256_fmadd_ps(offsets, _mm256_loadu_ps(a.ds), acc[m]);
  }
}

// out[m] = dot of weight row `row` with activation rows act + m * num_groups, m < rows (<= kTile).
template <int64_t T, bool kPacked>
void dot_tile(const uint8_t* row, int64_t num_units, const ActGroup* act, int64_t num_groups, int64_t rows,
              float* out) {
  __m256 acc[kTile];
  for (int64_t m = 0; m < rows; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < num_groups; ++g) group_tile<T, kPacked>(row, g, num_units, act, num_groups, rows, acc);
  for (int64_t m = 0; m < rows; ++m) out[m] = hsum(acc[m]);
}
#else
template <int64_t T, bool kPacked>
void dot_tile(const uint8_t* row, int64_t num_units, const ActGroup* act, int64_t num_groups, int64_t rows,
              float* out) {
  for (int64_t m = 0; m < rows; ++m) out[m] = 0.f;
  WeightUnit w;
  for (int64_t u = 0; u < num_units; ++u) {
    if (kPacked && u < repacked_units<T>(num_units)) {
      unpack_repacked<T>(row, num_units, u, &w);
    } else {
      unpack<T>(row, u, &w);
    }
    const int64_t g = u / kGroup, j = u % kGroup;
    for (int64_t m = 0; m < rows; ++m) {
      const ActGroup& a = act[m * num_groups + g];
      int32_t dot[2] = {0, 0};
      for (int64_t i = 0; i < kUnit; ++i)
        dot[i / 16] += (T == kQ8_0 ? static_cast<int8_t>(w.u[i]) : static_cast<int32_t>(w.u[i])) * a.q[kSlot[j]][i];
      for (int h = 0; h < 2; ++h)
        out[m] += w.scale[h] * a.d[h * kGroup + j] * static_cast<float>(dot[h]) + w.offset[h] * a.ds[h * kGroup + j];
    }
  }
}
#endif

}  // namespace draftwise_gguf
