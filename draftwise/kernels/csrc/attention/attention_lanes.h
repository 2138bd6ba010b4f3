// The arithmetic of paged_attention.cpp's rows (scores, softmax weights, weighted values, the merge
// of chunks), on vectors of kLanes floats (GCC vector extensions:
// one register on AVX512, two on AVX2). Every function here computes each lane, or each row, the
// same way whatever the lanes or rows beside it, and sums in one fixed order; the file including it
// is compiled without -ffast-math, so that order is the one written here.
#pragma once

#include <cstdint>
#include <cstring>
#include <algorithm>
#include <limits>
#include <utility>

namespace draftwise_attention {

constexpr int64_t kLanes = 16;
constexpr int64_t kDotLanes = 8;  // partial sums of a score
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t IVec __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef uint16_t HVec __attribute__((vector_size(kLanes * sizeof(uint16_t))));

inline Vec splat(float x) { return Vec{} + x; }

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// kLanes values of type T (float, or bf16 as its 16 bits) from p, as floats: exact either way.
template <typename T>
inline Vec load_as_float(const T* p) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return load(reinterpret_cast<const float*>(p));
  } else {
    static_assert(sizeof(T) == sizeof(uint16_t), "float or bf16");
    HVec bits;
    std::memcpy(&bits, p, sizeof bits);
    const IVec words = __builtin_convertvector(bits, IVec) << 16;
    Vec v;
    std::memcpy(&v, &words, sizeof v);
    return v;
  }
}

// kDotLanes values from a, then kDotLanes from b, as floats (two keys side by side, pair_key's order).
template <typename T>
inline Vec load_pair_as_float(const T* a, const T* b) {
  T both[kLanes];
  std::memcpy(both, a, kDotLanes * sizeof(T));
  std::memcpy(both + kDotLanes, b, kDotLanes * sizeof(T));
  return load_as_float(both);
}

inline float lane_max(Vec v) {
  float top = v[0];
  for (int l = 1; l < kLanes; ++l) top = top > v[l] ? top : v[l];
  return top;
}

// The lanes summed by the fixed tree: lane l + lane l + 8, then l + 4, l + 2, l + 1.
inline float lane_sum(Vec v) {
  float a[8], b[4];
  for (int l = 0; l < 8; ++l) a[l] = v[l] + v[l + 8];
  for (int l = 0; l < 4; ++l) b[l] = a[l] + a[l + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// exp of each lane (Cephes' expf polynomial, within 2 ulp); 0 below -87 (and for -inf).
inline Vec exp_lanes(Vec x) {
  const IVec tiny = x < -87.f;
  x = tiny ? splat(-87.f) : x;
  const Vec n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round(x / ln 2)
  Vec r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Vec poly = splat(1.9875691500e-4f);
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * (r * r) + r + 1.f;
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  Vec scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return tiny ? splat(0.f) : poly * scale;
}

inline float exp_one(float x) { return exp_lanes(splat(x))[0]; }

// Lane-wise sums: lanes of the pair (a, b) at `lo` plus those at `hi`.
#define DRAFTWISE_PAIR(a, b, lo, hi) (__builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi))

// Scores of kLanes keys (group g of `keys`) against kRows query rows, into out[0 .. kRows). A score
// is kDotLanes partial sums over the head dim (lane l sums d = l, l + kDotLanes, ... in order,
// multiply-adds) folded by one fixed tree (lane l with l + 4, then + 2, then + 1): every score the
// same operations whichever lane its key takes and whichever rows share the call. Row i's query is
// at query + i * 2 * padded_dim, twice over per kDotLanes dims ([padded_dim / kDotLanes][2][kDotLanes],
// pair_query); keys.pair(g, k, v) gives keys 2k and 2k + 1 of the group side by side for dims
// [v * kDotLanes, (v + 1) * kDotLanes): one multiply-add serves two keys, one load every row.
template <int kVecs, int kRows, typename Keys>
__attribute__((always_inline)) inline void group_scores(const float* query, int64_t padded_dim, const Keys& keys,
                                                        int64_t g, Vec* out) {
  const int64_t num_vecs = kVecs > 0 ? 2 * kVecs : 2 * padded_dim / kLanes;  // per key pair
  const IVec lo4{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const IVec hi4{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  const IVec lo2{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const IVec hi2{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  const IVec even{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  const IVec odd{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  if constexpr (kRows == 1) {  // one row: its 8 key pairs' chains in one pass over the dims
    Vec pairs[8] = {};
    for (int64_t v = 0; v < num_vecs; ++v) {
      const Vec q = load(query + v * kLanes);
      for (int k = 0; k < 8; ++k) pairs[k] = pairs[k] + q * keys.pair(g, k, v);
    }
    Vec fours[4], twos[2];  // 4 keys x 4 lanes, 8 keys x 2 lanes, in key order
    for (int i = 0; i < 4; ++i) fours[i] = DRAFTWISE_PAIR(pairs[2 * i], pairs[2 * i + 1], lo4, hi4);
    for (int i = 0; i < 2; ++i) twos[i] = DRAFTWISE_PAIR(fours[2 * i], fours[2 * i + 1], lo2, hi2);
    out[0] = DRAFTWISE_PAIR(twos[0], twos[1], even, odd);
    return;
  }
  Vec twos[kRows][2];  // per row: keys 0-7, then 8-15, two lanes each, in key order
  for (int half = 0; half < 2; ++half) {
    Vec pairs[kRows][4] = {};  // independent chains side by side: no multiply-add waits on the one before
    for (int64_t v = 0; v < num_vecs; ++v) {
      Vec key[4];
      for (int k = 0; k < 4; ++k) key[k] = keys.pair(g, 4 * half + k, v);
      for (int i = 0; i < kRows; ++i) {
        Vec q = load(query + i * 2 * padded_dim + v * kLanes);
#if defined(__AVX512F__)
        __asm__("" : "+v"(q));  // one load per row, held in a register for its 4 multiply-adds
#endif
        for (int k = 0; k < 4; ++k) pairs[i][k] = pairs[i][k] + q * key[k];
      }
    }
    for (int i = 0; i < kRows; ++i) {  // 4 keys x 4 lanes each, then 8 keys x 2 lanes
      const Vec f0 = DRAFTWISE_PAIR(pairs[i][0], pairs[i][1], lo4, hi4);
      const Vec f1 = DRAFTWISE_PAIR(pairs[i][2], pairs[i][3], lo4, hi4);
      twos[i][half] = DRAFTWISE_PAIR(f0, f1, lo2, hi2);
    }
  }
  for (int i = 0; i < kRows; ++i) out[i] = DRAFTWISE_PAIR(twos[i][0], twos[i][1], even, odd);
}

#undef DRAFTWISE_PAIR

// One query row (head_dim floats) as group_scores reads it: each kDotLanes dims twice, zero past head_dim.
inline void pair_query(const float* row, int64_t head_dim, int64_t padded_dim, float* out) {
  for (int64_t b = 0; b < padded_dim / kDotLanes; ++b)
    for (int64_t l = 0; l < kDotLanes; ++l) {
      const int64_t d = b * kDotLanes + l;
      out[2 * b * kDotLanes + l] = out[(2 * b + 1) * kDotLanes + l] = d < head_dim ? row[d] : 0.f;
    }
}

// Key t (padded_dim floats) at its place in group_scores' layout: keys 2p and 2p + 1 side by side
// per kDotLanes dims.
inline float* pair_key(float* tile, int64_t t, int64_t padded_dim) {
  return tile + (t / 2) * 2 * padded_dim + (t % 2) * kDotLanes;
}

// acc[r + i] += sum over t in [t0, t1), in order, of weights[r + i][t] x values[t], for kRows rows
// from r, the sums in registers in between; row r's weights are zero from seen[r] on (those keys
// are skipped: adding zeros changes nothing). Called over consecutive spans of keys from an acc of
// zeros, it sums exactly as one call over all of them.
// Only the value vectors [kV0, kV0 + kVecs) of each row (dims kV0 * kLanes on): a row's other
// vectors are other sums, so splitting the dims changes no value.
template <int kVecs, int kRows, int kV0 = 0, typename Values>
__attribute__((always_inline)) inline void weighted_span(const float* weights, int64_t r, int64_t num_keys,
                                                         const int64_t* seen, int64_t t0, int64_t t1,
                                                         const Values& values, int64_t padded_dim, float* acc) {
  int64_t end = t0;
  for (int i = 0; i < kRows; ++i) end = std::max(end, std::min(t1, seen[r + i]));
  if (end <= t0) return;
  Vec sum[kRows][kVecs];
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kVecs; ++v) sum[i][v] = load(acc + (r + i) * padded_dim + (kV0 + v) * kLanes);
  for (int64_t t = t0; t < end; ++t)
    for (int v = 0; v < kVecs; ++v) {
      const Vec value = values.value(t, kV0 + v);
      for (int i = 0; i < kRows; ++i) sum[i][v] = sum[i][v] + weights[(r + i) * num_keys + t] * value;
    }
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kVecs; ++v) store(acc + (r + i) * padded_dim + (kV0 + v) * kLanes, sum[i][v]);
}

// weighted_span for rows [0, num_rows) (acc [num_rows][padded_dim]): as many rows at a time as
// registers hold, the same arithmetic per row whichever block it falls in.
template <int kVecs, typename Values>
inline void weighted_span_rows(const float* weights, int64_t num_rows, int64_t num_keys, const int64_t* seen,
                               int64_t t0, int64_t t1, const Values& values, int64_t padded_dim, float* acc) {
  constexpr int kRows = kVecs <= 4 ? 4 : 2;
  int64_t r = 0;
#if defined(__AVX512F__)
  if constexpr (kVecs == 8) {  // four rows, half the dims at a time: each value vector read once for them
    for (; r + 4 <= num_rows; r += 4) {
      weighted_span<4, 4, 0>(weights, r, num_keys, seen, t0, t1, values, padded_dim, acc);
      weighted_span<4, 4, 4>(weights, r, num_keys, seen, t0, t1, values, padded_dim, acc);
    }
  }
#endif
  for (; r + kRows <= num_rows; r += kRows)
    weighted_span<kVecs, kRows>(weights, r, num_keys, seen, t0, t1, values, padded_dim, acc);
  for (; r + 2 <= num_rows; r += 2) weighted_span<kVecs, 2>(weights, r, num_keys, seen, t0, t1, values, padded_dim, acc);
  for (; r < num_rows; ++r) weighted_span<kVecs, 1>(weights, r, num_keys, seen, t0, t1, values, padded_dim, acc);
}

// weighted_values: every row's acc over all num_keys keys (acc [num_rows][padded_dim], overwritten).
template <int kVecs, typename Values>
void weighted_values(const float* weights, int64_t num_rows, int64_t num_keys, const int64_t* seen,
                     const Values& values, int64_t padded_dim, float* acc) {
  int64_t r = 0;
  if constexpr (kVecs > 0) {
    std::fill(acc, acc + num_rows * padded_dim, 0.f);
    weighted_span_rows<kVecs>(weights, num_rows, num_keys, seen, 0, num_keys, values, padded_dim, acc);
    return;
  }
  const int64_t num_vecs = padded_dim / kLanes;
  for (; r < num_rows; ++r) {
    float* out = acc + r * padded_dim;
    for (int64_t v = 0; v < num_vecs; ++v) store(out + v * kLanes, Vec{});
    for (int64_t t = 0; t < seen[r]; ++t) {
      const float w = weights[r * num_keys + t];
      for (int64_t v = 0; v < num_vecs; ++v)
        store(out + v * kLanes, load(out + v * kLanes) + w * values.value(t, v));
    }
  }
}

// A row's (max, sum, acc) so far merged with one more chunk's, in chunk order; a chunk with sum 0
// (no key seen: a seen key's weight is at least the top one's, 1) changes nothing.
inline void merge_chunk(float& max, float& sum, float* acc, float chunk_max, float chunk_sum, const float* chunk_acc,
                        int64_t padded_dim) {
  if (chunk_sum == 0.f) return;
  const float top = max > chunk_max ? max : chunk_max;
  const float keep = sum == 0.f ? 0.f : exp_one(max - top), take = exp_one(chunk_max - top);
  sum = sum * keep + chunk_sum * take;
  for (int64_t v = 0; v < padded_dim; v += kLanes)
    store(acc + v, load(acc + v) * keep + load(chunk_acc + v) * take);
  max = top;
}

// The keys a query row sees: [lo, hi), less, in a tree row, the keys from tree_start on whose bit is clear.
struct RowKeys {
  int64_t lo, hi;
  bool tree;
  int64_t tree_start;
  uint64_t bits;

  bool sees(int64_t j) const {
    return j >= lo && j < hi && (!tree || j < tree_start || ((bits >> (j - tree_start)) & 1) != 0);
  }
};

// Softmax weights of one row over its chunk (scores in `w`, [num_groups * kLanes]) in place, zero
// where the row sees no key; returns (max, sum). `packed` holds num_groups * kLanes floats of room.
inline std::pair<float, float> row_weights(float* w, int64_t num_groups, int64_t first, const RowKeys& keys,
                                           float* packed) {
  Vec top = splat(kMinusInf);
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t j0 = first + g * kLanes;
    Vec score = load(w + g * kLanes);
    if (!(j0 >= keys.lo && j0 + kLanes <= keys.hi && !keys.tree)) {  // a group the row partly sees
      IVec seen{};
      for (int64_t l = 0; l < kLanes; ++l) seen[l] = keys.sees(j0 + l) ? -1 : 0;
      score = seen ? score : splat(kMinusInf);
      store(w + g * kLanes, score);
    }
    top = top > score ? top : score;
  }
  const float max = lane_max(top);
  if (max == kMinusInf) {
    std::fill(w, w + num_groups * kLanes, 0.f);
    return {max, 0.f};
  }
  for (int64_t g = 0; g < num_groups; ++g) store(w + g * kLanes, exp_lanes(load(w + g * kLanes) - max));
  const float* summed = w;
  if (keys.tree && keys.tree_start < first + num_groups * kLanes) {  // ancestors at their positions
    std::fill(packed, packed + num_groups * kLanes, 0.f);
    const int64_t split = std::max<int64_t>(0, keys.tree_start - first);
    std::copy(w, w + split, packed);
    int64_t at = split;
    for (int64_t t = split; t < num_groups * kLanes; ++t)
      if (keys.sees(first + t)) packed[at++] = w[t];
    summed = packed;
  }
  Vec total{};
  for (int64_t g = 0; g < num_groups; ++g) total += load(summed + g * kLanes);
  return {max, lane_sum(total)};
}

}  // namespace draftwise_attention
