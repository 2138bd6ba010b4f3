// The interleaved layout of the k-quants (Q4_K, Q5_K, Q6_K), and its AVX512-VNNI kernel: the same
// 16 output features side by side as gguf_interleave.h, one int32 lane per output, so a Q4_K_M
// file's rows cost what Q4_0's cost.
//
// Layout: rows are taken 16 at a time (a column block); a block holds, super-block after super-block
// (256 weights of each row), a segment of exactly the bytes of those 16 rows' super-blocks:
//   Q4_K (144 bytes a row): the 16 fp16 d, the 16 fp16 dmin, the 12 packed scale bytes as 12 planes
//     of 16 (plane k, byte c = row c's scales[k]), then for each of the 8 units (32 weights) 4 x 64
//     code bytes laid out as gguf_interleave.h's Q4_0: in chunk p, byte 4c + j holds row c's
//     weight 4p + j in its low nibble and weight 16 + 4p + j in its high one;
//   Q5_K (176): as Q4_K, each unit's 256 code bytes followed by its high bits as Q5_0's 4 x 16 bytes
//     of 64-bit masks (chunk p: bit 4c + j = weight 4p + j of row c, then weight 16 + 4p + j);
//   Q6_K (210): the 16 fp16 d, the 16 int8 scales as 16 planes of 16, then for each unit its low
//     4 bits as Q4_K's 256 code bytes, and its high 2 bits as two 64-byte registers: in the first,
//     bits 2p, 2p + 1 of byte 4c + j are the high bits of row c's weight 4p + j; in the second, of
//     weight 16 + 4p + j.
// Every value is the file's, moved: the weights the kernel computes are exactly the file's. For
// each unit and output: d_w * (integer dot of codes and 8-bit activations) * d_a, plus the unit's
// offset (-dmin m; Q6_K: -32 d sc per half) times d_a * sum(q), in a fixed order per row (batch
// invariance).
#pragma once

#include "gguf_interleave.h"

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#endif

namespace draftwise_gguf {

template <int64_t T>
constexpr bool is_k_quant() { return T == kQ4_K || T == kQ5_K || T == kQ6_K; }

// Where the codes of unit s start in a segment, and the bytes each unit takes there.
template <int64_t T>
constexpr int64_t k_codes_at() { return T == kQ6_K ? 32 + 256 : 64 + 192; }
template <int64_t T>
constexpr int64_t k_unit_bytes() { return T == kQ4_K ? 256 : T == kQ5_K ? 320 : 384; }

// Word p (bytes 4p .. 4p + 3) of 16 bytes.
inline uint32_t word_at(const uint8_t* p, int64_t i) {
  uint32_t w;
  std::memcpy(&w, p + 4 * i, 4);
  return w;
}

// A unit's four-bit codes of row c, as words: lo[p] holds weights 4p .. 4p + 3, hi[p] weights
// 16 + 4p .. 19 + 4p (a code per byte, 0-15) -> the unit's 4 code chunks.
inline void put_nibbles(const uint32_t* lo, const uint32_t* hi, int64_t c, uint8_t* unit) {
  for (int64_t p = 0; p < 4; ++p) {
    const uint32_t pairs = lo[p] | (hi[p] << 4);
    std::memcpy(unit + 64 * p + 4 * c, &pairs, 4);
  }
}

// Row c's super-block `b` -> its bytes of the segment `seg` (zeroed beforehand). Word-wide bit
// operations on the file's bytes: a code never crosses its byte.
template <int64_t T>
void interleave_k_row(const uint8_t* b, int64_t c, uint8_t* seg) {
  constexpr uint32_t kLow4 = 0x0F0F0F0F;
  if (T == kQ6_K) {
    std::memcpy(seg + 2 * c, b + 208, 2);
    for (int64_t k = 0; k < 16; ++k) seg[32 + 16 * k + c] = b[192 + k];
  } else {
    std::memcpy(seg + 2 * c, b, 2);
    std::memcpy(seg + 32 + 2 * c, b + 2, 2);
    for (int64_t k = 0; k < 12; ++k) seg[64 + 16 * k + c] = b[4 + k];
  }
  for (int64_t s = 0; s < 8; ++s) {
    uint8_t* unit = seg + k_codes_at<T>() + s * k_unit_bytes<T>();
    const uint8_t* q = T == kQ6_K ? b + 64 * (s / 4) + (s % 2) * 32 : b + (T == kQ5_K ? 48 : 16) + (s / 2) * 32;
    const int shift = T == kQ6_K ? ((s % 4) >= 2 ? 4 : 0) : 4 * (s % 2);  // which nibble of q
    uint32_t lo[4], hi[4];
    for (int64_t p = 0; p < 4; ++p) lo[p] = (word_at(q, p) >> shift) & kLow4, hi[p] = (word_at(q, 4 + p) >> shift) & kLow4;
    put_nibbles(lo, hi, c, unit);
    if (T == kQ6_K) {  // high 2 bits of weight i: bits 2k of qh[i]; byte j of a word gathers 4p + j over p
      const uint8_t* qh = b + 128 + 32 * (s / 4);
      const int high_shift = 2 * (s % 4);
      uint32_t out_lo = 0, out_hi = 0;
      for (int64_t p = 0; p < 4; ++p) {
        out_lo |= ((word_at(qh, p) >> high_shift) & 0x03030303) << (2 * p);
        out_hi |= ((word_at(qh, 4 + p) >> high_shift) & 0x03030303) << (2 * p);
      }
      std::memcpy(unit + 256 + 4 * c, &out_lo, 4);
      std::memcpy(unit + 320 + 4 * c, &out_hi, 4);
    }
    if (T == kQ5_K) {  // high bit of weight i: bit s of qh[i]; 4 of them to 4 adjacent mask bits
      uint64_t* masks = reinterpret_cast<uint64_t*>(unit + 256);
      const auto four_bits = [&](uint32_t w) {
        w = (w >> s) & 0x01010101;
        return static_cast<uint64_t>((w | (w >> 7) | (w >> 14) | (w >> 21)) & 0xF) << (4 * c);
      };
      for (int64_t p = 0; p < 4; ++p) masks[2 * p] |= four_bits(word_at(b + 16, p)), masks[2 * p + 1] |= four_bits(word_at(b + 16, 4 + p));
    }
  }
}

// One column block of a k-quant: 16 file rows of num_blocks super-blocks each -> the interleaved block.
template <int64_t T>
void interleave_k_block(const uint8_t* src, int64_t row_bytes, int64_t num_blocks, uint8_t* dst) {
  constexpr int64_t B = Layout<T>::bytes;
  for (int64_t sb = 0; sb < num_blocks; ++sb) {
    uint8_t* seg = dst + sb * kBlockCols * B;
    std::memset(seg, 0, kBlockCols * B);
    for (int64_t c = 0; c < kBlockCols; ++c) interleave_k_row<T>(src + c * row_bytes + sb * B, c, seg);
  }
}

#if defined(DRAFTWISE_GGUF_INTERLEAVED)
// Unit s's scales (per half: Q6_K has two) and offsets of the 16 outputs of a segment.
template <int64_t T>
inline void k_unit_scales(const uint8_t* seg, __m512 d, __m512 dmin, int64_t s, __m512* scale, __m512* offset) {
  const auto plane = [&](int64_t k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(seg + 16 * k)); };
  if (T == kQ6_K) {
    for (int64_t h = 0; h < 2; ++h) {
      const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(plane(2 + 2 * s + h)));
      scale[h] = opaque(_mm512_mul_ps(d, sc));
      offset[h] = opaque(_mm512_mul_ps(scale[h], _mm512_set1_ps(-32.f)));
    }
    return;
  }
  const __m128i low6 = _mm_set1_epi8(63), low4 = _mm_set1_epi8(0xF);
  __m128i sc, mn;
  if (s < 4) {
    sc = _mm_and_si128(plane(4 + s), low6);
    mn = _mm_and_si128(plane(8 + s), low6);
  } else {  // (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4, and (q[j + 4] >> 4) | (q[j] >> 6) << 4
    const __m128i top_sc = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(plane(4 + s - 4), 6), _mm_set1_epi8(3)), 4);
    const __m128i top_mn = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(plane(4 + s), 6), _mm_set1_epi8(3)), 4);
    sc = _mm_or_si128(_mm_and_si128(plane(4 + s + 4), low4), top_sc);
    mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(plane(4 + s + 4), 4), low4), top_mn);
  }
  scale[0] = scale[1] = opaque(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc))));
  offset[0] = offset[1] = opaque(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn))));
}

// Chunk k of a unit's codes: weights 4k + j (lo) and 16 + 4k + j (hi) of each row.
template <int64_t T>
inline void k_chunk(const uint8_t* unit, int64_t k, __m512i* lo, __m512i* hi) {
  const __m512i raw = _mm512_loadu_si512(unit + 64 * k), mask = _mm512_set1_epi8(0x0F);
  *lo = _mm512_and_si512(raw, mask);
  *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
  if (T == kQ5_K) {
    uint64_t high[2];
    std::memcpy(high, unit + 256 + 16 * k, 16);
    const __m512i sixteen = _mm512_set1_epi8(16);
    *lo = _mm512_or_si512(*lo, _mm512_and_si512(_mm512_movm_epi8(_cvtu64_mask64(high[0])), sixteen));
    *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_movm_epi8(_cvtu64_mask64(high[1])), sixteen));
  } else if (T == kQ6_K) {  // bits 2k, 2k + 1 of each byte -> bits 4, 5
    const __m512i three = _mm512_set1_epi8(3);
    const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(2 * k));
    const __m512i h_lo = _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512(unit + 256), shift), three);
    const __m512i h_hi = _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512(unit + 320), shift), three);
    *lo = _mm512_or_si512(*lo, _mm512_slli_epi16(h_lo, 4));
    *hi = _mm512_or_si512(*hi, _mm512_slli_epi16(h_hi, 4));
  }
}

// out[m * ld + c] = dot of row m (< rows <= kBlockRows) of `act` with output c of a k-quant block.
template <int64_t T, int64_t rows>
void dot_k_block(const uint8_t* block, int64_t num_units, const ActGroup* act, int64_t num_groups,
                 float* out, int64_t ld) {
  constexpr int64_t B = Layout<T>::bytes;
  constexpr int64_t kHalves = T == kQ6_K ? 2 : 1;  // integer dots kept apart: one per scale
  __m512 acc[rows];
  for (int64_t m = 0; m < rows; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < num_units / 8; ++sb) {
    const uint8_t* seg = block + sb * kBlockCols * B;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(seg)));
    const __m512 dmin = T == kQ6_K ? d
        : _mm512_sub_ps(_mm512_setzero_ps(),
                        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(seg + 32))));
    if constexpr (rows > 1) prefetch_weights(seg + kPrefetchBytes, k_codes_at<T>());
    for (int64_t s = 0; s < 8; ++s) {
      const uint8_t* unit = seg + k_codes_at<T>() + s * k_unit_bytes<T>();
      if constexpr (rows > 1) prefetch_weights(unit + kPrefetchBytes, k_unit_bytes<T>());
      const int64_t u = sb * 8 + s, g = u / kGroup, j = u % kGroup, slot = kSlot[j];
      // One integer dot per half (lo, hi) even where one scale serves both (then summed after): two
      // independent multiply-add chains instead of one of eight. Integer sums: the same result.
      __m512i dot[rows][2];
      for (int64_t m = 0; m < rows; ++m) dot[m][0] = dot[m][1] = _mm512_setzero_si512();
      for (int64_t k = 0; k < 4; ++k) {
        __m512i lo, hi;
        k_chunk<T>(unit, k, &lo, &hi);
        for (int64_t m = 0; m < rows; ++m) {
          const int8_t* q = act[m * num_groups + g].q[slot];
          int32_t x_lo, x_hi;
          std::memcpy(&x_lo, q + 4 * k, 4);
          std::memcpy(&x_hi, q + 16 + 4 * k, 4);
          dot[m][0] = _mm512_dpbusd_epi32(dot[m][0], lo, _mm512_set1_epi32(x_lo));
          dot[m][1] = _mm512_dpbusd_epi32(dot[m][1], hi, _mm512_set1_epi32(x_hi));
        }
      }
      if (kHalves == 1)
        for (int64_t m = 0; m < rows; ++m) dot[m][0] = _mm512_add_epi32(dot[m][0], dot[m][1]);
      __m512 scale[2], offset[2];
      k_unit_scales<T>(seg, d, dmin, s, scale, offset);
      for (int64_t m = 0; m < rows; ++m) {
        const ActGroup& a = act[m * num_groups + g];
        const __m512 da = _mm512_set1_ps(a.d[j]);
        for (int64_t h = 0; h < kHalves; ++h)
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m][h]), opaque(_mm512_mul_ps(scale[h], da)), acc[m]);
        acc[m] = _mm512_fmadd_ps(offset[0], _mm512_set1_ps(a.ds[j]), acc[m]);
        acc[m] = _mm512_fmadd_ps(offset[1], _mm512_set1_ps(a.ds[kGroup + j]), acc[m]);
      }
    }
  }
  for (int64_t m = 0; m < rows; ++m) _mm512_storeu_ps(out + m * ld, acc[m]);
}
#endif

}  // namespace draftwise_gguf
