// GGUF block layouts shared by draftwise's kernels over quantized weights (gguf_linear.cpp,
// gguf_repack.cpp): the type ids, bytes per block, and each unit of 32 weights as unsigned codes u
// with a scale and an offset per half of 16, so that w_i = scale * u_i + offset. `unpack` is the
// scalar reference; the kernels' SIMD loads follow it.
//
// Repacked layout (Q4_0, Q4_1, Q5_0, Q8_0; gguf_linear.py's REPACKED; where gguf_interleave.h applies,
// its layout instead): each row's whole groups of kGroup units are
// rewritten once at load so that one load feeds two units and the group's scales sit together:
// Q4_0 / Q4_1: 32 bytes holding units 0 and 1 (byte i: unit 0's code i in the low nibble, unit 1's
// in the high one), 32 bytes for units 2 and 3, then the 4 fp16 d (and the 4 fp16 m); Q8_0: the 4
// units' 128 code bytes in slot order (kSlot), then the 4 fp16 d. A group takes exactly the bytes
// of its 4 blocks. A row's last, partial group of 2 units is repacked as a pair: Q4_0 / Q4_1: 32
// bytes of nibble pairs, then the 2 fp16 d (and the 2 fp16 m); Q8_0: the 2 units' 64 code bytes,
// then the 2 fp16 d. Q5_0: the low 4 bits of its codes as Q4_0's nibble pairs (64 bytes), the 4
// units' 32-bit masks of high bits in slot order (16 bytes), then the 4 fp16 d; its partial
// groups keep the file's layout. A partial group of 1 or 3 units keeps the file's block layout.
//
// Slot order: a 64-byte load of a repacked Q4 group's nibble pairs splits into units (0, 2) and
// (1, 3); Q8_0's codes and the quantized activations (gguf_act.h) are stored in that same order,
// units 0, 2, 1, 3, so one 512-bit register pairs with one 64-byte load of either.
#pragma once

#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace draftwise_gguf {

constexpr int64_t kUnit = 32;
constexpr int64_t kGroup = 4;  // units whose integer dots are reduced and scaled together
constexpr int64_t kTile = 8;   // activation rows sharing each unpacked group of weights
constexpr int64_t kSlot[kGroup] = {0, 2, 1, 3};  // where unit j of a group is stored (its own inverse)
enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

// One unit of weights as the kernel reads it: w_i = scale[h] * u_i + offset[h] for h = i / 16,
// u_i the block's unsigned codes (Q8_0: its signed bytes).
struct WeightUnit {
  uint8_t u[kUnit];
  float scale[2];
  float offset[2];
};

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
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

#if defined(__AVX2__)
// `v` as computed, hidden from the optimizer: -ffast-math may otherwise reassociate a product
// chain (sc * d) * d_a differently where it is inlined into different kernels, and every kernel
// must give an output the same bits (batch invariance).
template <typename V>
inline V opaque(V v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#else
  asm("" : "+x"(v));
#endif
  return v;
}
#endif

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes.
inline void scale_min_k4(int64_t j, const uint8_t* q, float* sc, float* m) {
  if (j < 4) {
    *sc = q[j] & 63, *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The scales and offsets of unit `s` of block `b` (both halves).
template <int64_t T>
inline void unit_scales(const uint8_t* b, int64_t s, float* scale, float* offset) {
  if (T == kQ6_K) {  // ql[128], qh[64], int8 scales[16], d: one scale per 16, codes 0-63 around 32
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * (s / 4) + 2 * (s % 4);
    const float d = half_at(b + 208);
    scale[0] = d * sc[0], scale[1] = d * sc[1];
    offset[0] = -32.f * scale[0], offset[1] = -32.f * scale[1];
    return;
  }
  float sc = 1.f, min = 0.f;
  if (T == kQ4_K || T == kQ5_K) {
    scale_min_k4(s, b + 4, &sc, &min);
    sc *= half_at(b), min *= -half_at(b + 2);
  } else {
    sc = half_at(b);
    min = T == kQ4_1 || T == kQ5_1 ? half_at(b + 2) : T == kQ4_0 ? -8.f * sc : T == kQ5_0 ? -16.f * sc : 0.f;
  }
  scale[0] = scale[1] = sc;
  offset[0] = offset[1] = min;
}

// The weights of unit `u` of a row, scalar (the reference the SIMD loads below follow).
template <int64_t T>
void unpack(const uint8_t* row, int64_t u, WeightUnit* w) {
  const uint8_t* b = row + (u / Layout<T>::units) * Layout<T>::bytes;
  const int64_t s = u % Layout<T>::units;  // unit within its block
  unit_scales<T>(b, s, w->scale, w->offset);
  if (T == kQ4_0 || T == kQ4_1 || T == kQ5_0 || T == kQ5_1) {
    const bool five = T == kQ5_0 || T == kQ5_1;
    const uint8_t* qs = b + (T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8);
    uint32_t high = 0;
    if (five) std::memcpy(&high, b + (T == kQ5_0 ? 2 : 4), 4);
    for (int i = 0; i < 16; ++i) {
      w->u[i] = (qs[i] & 0xF) | (five ? ((high >> i) & 1) << 4 : 0);
      w->u[i + 16] = (qs[i] >> 4) | (five ? ((high >> (i + 16)) & 1) << 4 : 0);
    }
  } else if (T == kQ8_0) {
    std::memcpy(w->u, b + 2, kUnit);
  } else if (T == kQ4_K || T == kQ5_K) {
    const uint8_t* qs = b + (T == kQ5_K ? 48 : 16) + (s / 2) * 32;
    for (int i = 0; i < kUnit; ++i)
      w->u[i] = ((qs[i] >> ((s % 2) * 4)) & 0xF) | (T == kQ5_K ? ((b[16 + i] >> s) & 1) << 4 : 0);
  } else {  // Q6_K
    const int64_t h = s / 4, k = s % 4;
    const uint8_t* ql = b + 64 * h + (k & 1) * 32;
    const uint8_t* qh = b + 128 + 32 * h;
    for (int i = 0; i < kUnit; ++i)
      w->u[i] = ((k >= 2 ? ql[i] >> 4 : ql[i] & 0xF)) | (((qh[i] >> (2 * k)) & 3) << 4);
  }
}

// Units in the repacked layout of a row of num_units: those of whole groups and of a last pair.
template <int64_t T>
inline int64_t repacked_units(int64_t num_units) {
  return num_units % kGroup == 2 && T != kQ5_0 ? num_units : num_units / kGroup * kGroup;
}

// unpack<T> for a unit u < repacked_units<T>(num_units) of a repacked row.
template <int64_t T>
void unpack_repacked(const uint8_t* row, int64_t num_units, int64_t u, WeightUnit* w) {
  const uint8_t* p = row + (u / kGroup) * kGroup * Layout<T>::bytes;
  const int64_t j = u % kGroup, n = std::min<int64_t>(kGroup, num_units - u / kGroup * kGroup);  // 4 or a pair
  const uint8_t* meta = p + (T == kQ8_0 ? n * kUnit : T == kQ5_0 ? 2 * kUnit + 4 * kGroup : n / 2 * kUnit);
  const int64_t slot = n == kGroup ? kSlot[j] : j;
  uint32_t high = 0;
  if (T == kQ5_0) std::memcpy(&high, p + 2 * kUnit + 4 * kSlot[j], 4);
  for (int64_t i = 0; i < kUnit; ++i)
    w->u[i] = T == kQ8_0 ? p[slot * kUnit + i]
                         : ((p[(j / 2) * kUnit + i] >> (4 * (j % 2))) & 0xF) | (((high >> i) & 1) << 4);
  const float d = half_at(meta + 2 * j);
  w->scale[0] = w->scale[1] = d;
  w->offset[0] = w->offset[1] = T == kQ4_1   ? half_at(meta + 2 * (n + j))
                                 : T == kQ4_0 ? -8.f * d
                                 : T == kQ5_0 ? -16.f * d
                                              : 0.f;
}

}  // namespace draftwise_gguf
