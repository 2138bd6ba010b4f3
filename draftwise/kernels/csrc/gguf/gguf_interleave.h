// The interleaved layout of Q4_0, Q4_1, Q5_0 and Q8_0 weights, and its AVX512-VNNI kernel: 16 output
// features side by side, so each int32 lane of a 512-bit register is one output and no sum is
// ever reduced across lanes.
//
// Layout (where interleaved<T>(out_features) holds): the rows are taken 16 at a time (a column
// block: outputs 16b .. 16b + 15); a block holds, unit after unit (32 weights of each row), a
// segment of exactly the bytes of those 16 rows' blocks for that unit:
//   Q4_0 / Q4_1: 4 x 64 code bytes, then the 16 fp16 d (then the 16 fp16 m). In code chunk p,
//     byte 4c + j is row c's file byte qs[4p + j]: low nibble = weight 4p + j, high = 16 + 4p + j;
//   Q5_0: Q4_0's 4 x 64 bytes of the codes' low 4 bits, then 4 x 16 bytes of high bits: for chunk p,
//     a 64-bit mask whose bit 4c + j is weight 4p + j's high bit of row c, then one for 16 + 4p + j;
//     then the 16 fp16 d;
//   Q8_0: 8 x 64 code bytes (chunk k, byte 4c + j = row c's weight 4k + j), then the 16 fp16 d.
// A block takes the bytes of its 16 rows, in the same place: the tensor keeps its shape.
//
// The kernel: for each unit, its chunks' codes against each activation row's 4 matching int8
// values broadcast to every lane (vpdpbusd), the unit's int32 dot per output converted and scaled
// by d_w * d_a, plus the offset m_w * d_a * sum(q). Every row runs the same operations in the same
// order whatever rows share the call (batch invariance).
#pragma once

#include "gguf_act.h"

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define DRAFTWISE_GGUF_INTERLEAVED 1
#include <immintrin.h>
#endif

namespace draftwise_gguf {

constexpr int64_t kBlockCols = 16;  // outputs per column block
constexpr int64_t kBlockRows = 8;   // activation rows per pass over a block
// How far ahead of the unit being computed a multi-row call asks for weights (prefetch_weights).
constexpr int64_t kPrefetchBytes = 2048;

// Whether a weight of type T with this many outputs is stored interleaved when repacked (the
// k-quants' layout: gguf_interleave_k.h).
template <int64_t T>
constexpr bool interleaved(int64_t out_features) {
#if defined(DRAFTWISE_GGUF_INTERLEAVED)
  return (T == kQ4_0 || T == kQ4_1 || T == kQ5_0 || T == kQ8_0 || T == kQ4_K || T == kQ5_K || T == kQ6_K) &&
         out_features % kBlockCols == 0;
#else
  (void)out_features;
  return false;
#endif
}

template <int64_t T>
constexpr int64_t num_chunks() { return T == kQ8_0 ? 8 : 4; }  // 64-byte code chunks per unit segment

template <int64_t T>
constexpr int64_t code_bytes() { return num_chunks<T>() * 64 + (T == kQ5_0 ? 64 : 0); }  // Q5_0: + high-bit masks

// One column block: `rows` (16) file rows of num_units blocks each -> the interleaved block.
template <int64_t T>
void interleave_block(const uint8_t* src, int64_t row_bytes, int64_t num_units, uint8_t* dst) {
  constexpr int64_t B = Layout<T>::bytes, qs = T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 2;
  for (int64_t u = 0; u < num_units; ++u) {
    uint8_t* seg = dst + u * kBlockCols * B;
    if (T == kQ5_0) std::memset(seg + 4 * 64, 0, 64);
    for (int64_t c = 0; c < kBlockCols; ++c) {
      const uint8_t* b = src + c * row_bytes + u * B;
      for (int64_t k = 0; k < num_chunks<T>(); ++k) std::memcpy(seg + 64 * k + 4 * c, b + qs + 4 * k, 4);
      if (T == kQ5_0) {  // the high bits, regrouped as each chunk's 64-bit masks
        uint32_t high;
        std::memcpy(&high, b + 2, 4);
        uint64_t* masks = reinterpret_cast<uint64_t*>(seg + 4 * 64);
        for (int64_t p = 0; p < 4; ++p)
          for (int64_t j = 0; j < 4; ++j) {
            masks[2 * p] |= static_cast<uint64_t>((high >> (4 * p + j)) & 1) << (4 * c + j);
            masks[2 * p + 1] |= static_cast<uint64_t>((high >> (16 + 4 * p + j)) & 1) << (4 * c + j);
          }
      }
      std::memcpy(seg + code_bytes<T>() + 2 * c, b, 2);                                        // d
      if (T == kQ4_1) std::memcpy(seg + code_bytes<T>() + 2 * kBlockCols + 2 * c, b + 2, 2);  // m
    }
  }
}

#if defined(DRAFTWISE_GGUF_INTERLEAVED)
// Asks for `bytes` of weights from p on, a cache line at a time. A call of several rows computes
// long enough per weight byte that the hardware prefetcher alone leaves memory idle between bursts;
// one row is bound by memory bandwidth and is left to the hardware.
inline void prefetch_weights(const uint8_t* p, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(p + line, 0, 3);
}

// out[m * ld + c] = dot of row m (< rows <= kBlockRows) of `act` with output c of the block.
template <int64_t T, int64_t rows>
void dot_block(const uint8_t* block, int64_t num_units, const ActGroup* act, int64_t num_groups,
               float* out, int64_t ld) {
  constexpr int64_t B = Layout<T>::bytes;
  __m512 acc[rows];
  for (int64_t m = 0; m < rows; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t u = 0; u < num_units; ++u) {
    const uint8_t* seg = block + u * kBlockCols * B;
    if constexpr (rows > 1) prefetch_weights(seg + kPrefetchBytes, kBlockCols * B);
    const int64_t g = u / kGroup, j = u % kGroup, slot = kSlot[j];
    __m512i dot[rows];
    for (int64_t m = 0; m < rows; ++m) dot[m] = _mm512_setzero_si512();
    for (int64_t k = 0; k < num_chunks<T>(); ++k) {
      const __m512i raw = _mm512_loadu_si512(seg + 64 * k);
      if (T == kQ8_0) {
        const __m512i w = _mm512_xor_si512(raw, bias);  // signed codes biased to 0..255
        for (int64_t m = 0; m < rows; ++m) {
          int32_t x;
          std::memcpy(&x, act[m * num_groups + g].q[slot] + 4 * k, 4);
          dot[m] = _mm512_dpbusd_epi32(dot[m], w, _mm512_set1_epi32(x));
        }
      } else {
        __m512i lo = _mm512_and_si512(raw, mask), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
        if (T == kQ5_0) {
          uint64_t high[2];
          std::memcpy(high, seg + 4 * 64 + 16 * k, 16);
          const __m512i sixteen = _mm512_set1_epi8(16);
          lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_movm_epi8(_cvtu64_mask64(high[0])), sixteen));
          hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_movm_epi8(_cvtu64_mask64(high[1])), sixteen));
        }
        for (int64_t m = 0; m < rows; ++m) {
          const int8_t* q = act[m * num_groups + g].q[slot];
          int32_t x_lo, x_hi;
          std::memcpy(&x_lo, q + 4 * k, 4);
          std::memcpy(&x_hi, q + 16 + 4 * k, 4);
          dot[m] = _mm512_dpbusd_epi32(dot[m], lo, _mm512_set1_epi32(x_lo));
          dot[m] = _mm512_dpbusd_epi32(dot[m], hi, _mm512_set1_epi32(x_hi));
        }
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(seg + code_bytes<T>())));
    __m512 offset;
    if (T == kQ4_1) {
      offset = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(seg + code_bytes<T>() + 32)));
    } else {
      offset = opaque(_mm512_mul_ps(d, _mm512_set1_ps(T == kQ4_0 ? -8.f : T == kQ5_0 ? -16.f : -128.f)));
    }
    for (int64_t m = 0; m < rows; ++m) {
      const ActGroup& a = act[m * num_groups + g];
      const __m512 scale = opaque(_mm512_mul_ps(d, _mm512_set1_ps(a.d[j])));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m]), scale, acc[m]);
      acc[m] = _mm512_fmadd_ps(offset, _mm512_set1_ps(a.ds[j]), acc[m]);
      acc[m] = _mm512_fmadd_ps(offset, _mm512_set1_ps(a.ds[kGroup + j]), acc[m]);
    }
  }
  for (int64_t m = 0; m < rows; ++m) _mm512_storeu_ps(out + m * ld, acc[m]);
}
#endif

}  // namespace draftwise_gguf
