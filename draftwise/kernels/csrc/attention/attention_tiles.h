// The paged attention kernel's view of one call (Problem, Span) and how it reads the cache: a
// span's scaled queries (prepare_rows), and one chunk of keys and values of consecutive kv heads
// either read where they lie (RowSource over cache_rows' pointers, after touch_rows streamed the
// chunk's whole rows in) or converted to fp32 tiles in group_scores' layout (TileSource over
// load_tiles). Both give group_scores and weighted_values the same floats. Used by
// paged_attention.cpp only.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_lanes.h"

namespace draftwise_attention {

constexpr int64_t kChunkKeys = 128;  // keys per chunk (PAGED_CHUNK_KEYS in attention.py)
constexpr int64_t kPrefetchKeys = 32;  // keys ahead whose rows load_tiles asks the cache for

struct Problem {
  int64_t num_heads, num_kv_heads, group, head_dim, padded_dim, block_size, table_width, num_slots;
  int64_t sliding_window;
  float scale;
  const int64_t* table;   // [num_seqs, table_width]
  const int64_t* starts;  // [num_seqs + 1]
  const int64_t* lens;    // [num_seqs]
  const int64_t* tree;    // [num_tokens, 2] (tree_start, bits) per row; nullptr: every row causal
};

// Query rows [first, first + count) of one (sequence, kv head); its rows are query x head in group.
struct Span {
  int64_t seq, kv_head, first, count;
};

// The keys query row `token`, at position `pos`, sees (attention_lanes.h).
inline RowKeys row_keys(const Problem& p, int64_t token, int64_t pos) {
  const int64_t tree_start = p.tree != nullptr ? p.tree[2 * token] : pos + 1;
  RowKeys keys{0, pos + 1, tree_start <= pos, tree_start, 0};
  if (keys.tree) keys.bits = static_cast<uint64_t>(p.tree[2 * token + 1]);
  if (p.sliding_window > 0) {
    const int64_t logical = keys.tree ? tree_start + std::popcount(keys.bits) - 1 : pos;
    const int64_t window_lo = logical - p.sliding_window + 1;  // the tree region keeps its bits
    keys.lo = std::max<int64_t>(0, keys.tree ? std::min(window_lo, tree_start) : window_lo);
  }
  return keys;
}

inline void to_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void to_float(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(dst + i, &word, sizeof(float));
  }
}

// What one item works in: its rows' scaled queries, one chunk's keys and values, scores / weights.
struct Scratch {
  std::vector<float> query, keys, values, weights, packed, row;
  std::vector<RowKeys> rows;
  std::vector<int64_t> rows_at;  // per key of the chunk: its row's offset in the cache
  std::vector<int64_t> seen;  // per row: keys of the chunk it may see (its weights are zero past them)
};

// A chunk's result for each row of a span: (max, sum, acc [padded_dim]); sum 0 = no key seen.
struct Partial {
  float* max;
  float* sum;
  float* acc;
};

template <typename T>
struct Inputs {
  const T* q;
  const T* k_cache;
  const T* v_cache;
};

// Scaled fp32 queries of the span's rows (as group_scores reads them) and each row's keys into `s`.
template <typename T>
inline void prepare_rows(const Problem& p, const Inputs<T>& in, const Span& span, Scratch& s) {
  const int64_t D = p.head_dim, P = p.padded_dim, q0 = p.starts[span.seq];
  const int64_t num_q = p.starts[span.seq + 1] - q0, ctx = p.lens[span.seq];
  s.query.resize(span.count * p.group * 2 * P);
  s.row.resize(D);
  s.rows.clear();
  for (int64_t i = span.first; i < span.first + span.count; ++i) {
    for (int64_t g = 0; g < p.group; ++g) {
      to_float(in.q + ((q0 + i) * p.num_heads + span.kv_head * p.group + g) * D, s.row.data(), D);
      for (int64_t d = 0; d < D; ++d) s.row[d] *= p.scale;
      pair_query(s.row.data(), D, P, s.query.data() + ((i - span.first) * p.group + g) * 2 * P);
      s.rows.push_back(row_keys(p, q0 + i, ctx - num_q + i));
    }
  }
}

// Key and value rows at `at` on their way to the cache (rows of a context are scattered over blocks,
// which the hardware prefetcher does not follow).
template <typename T>
inline void prefetch_rows(const Inputs<T>& in, int64_t at, int64_t num_values) {
  for (int64_t byte = 0; byte < num_values * static_cast<int64_t>(sizeof(T)); byte += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(in.k_cache + at) + byte);
    __builtin_prefetch(reinterpret_cast<const char*>(in.v_cache + at) + byte);
  }
}

// Keys and values [first, first + n) of kv heads [h0, h0 + nh) of sequence `seq` into fp32 tiles of
// n rounded up to kLanes keys, one tile per head (head j's at j * tile_floats(n)): keys as
// group_scores reads them (pair_key), values [key][padded_dim]; zero past n and past head_dim (so a
// zero weight times them adds exactly nothing). A slot holds its heads' rows side by side, so the nh
// rows of a key are read as one run.
inline int64_t tile_floats(const Problem& p, int64_t n) { return (n + kLanes - 1) / kLanes * kLanes * p.padded_dim; }

// at[t]: where key first + t of sequence `seq` has its kv head h0's row (t < n), a block at a time.
inline void row_offsets(const Problem& p, int64_t seq, int64_t h0, int64_t first, int64_t n, std::vector<int64_t>& at) {
  const int64_t stride = p.num_kv_heads * p.head_dim;  // between a block's slots
  at.resize(n);
  for (int64_t t = 0; t < n;) {
    const int64_t j = first + t, in_block = std::min(p.block_size - j % p.block_size, n - t);
    const int64_t base = ((p.table[seq * p.table_width + j / p.block_size] * p.block_size + j % p.block_size) *
                          p.num_kv_heads + h0) * p.head_dim;
    for (int64_t i = 0; i < in_block; ++i) at[t + i] = base + i * stride;
    t += in_block;
  }
}

template <typename T>
inline void load_tiles(const Problem& p, const Inputs<T>& in, int64_t seq, int64_t h0, int64_t nh, int64_t first, int64_t n,
                Scratch& s) {
  const int64_t D = p.head_dim, P = p.padded_dim, num_keys = (n + kLanes - 1) / kLanes * kLanes;
  const int64_t tile = tile_floats(p, n);
  s.keys.resize(nh * tile);
  s.values.resize(nh * tile);
  s.row.assign(P, 0.f);
  row_offsets(p, seq, h0, first, n, s.rows_at);
  for (int64_t t = 0; t < std::min(n, kPrefetchKeys); ++t) prefetch_rows(in, s.rows_at[t], nh * D);
  for (int64_t t = 0; t < num_keys; ++t) {
    if (t < n && t + kPrefetchKeys < n) prefetch_rows(in, s.rows_at[t + kPrefetchKeys], nh * D);
    for (int64_t h = 0; h < nh; ++h) {
      float* value = s.values.data() + h * tile + t * P;
      float* key = pair_key(s.keys.data() + h * tile, t, P);
      if (t >= n) {  // past the chunk's keys: zeros
        for (int64_t b = 0; b < P / kDotLanes; ++b) std::fill_n(key + 2 * b * kDotLanes, kDotLanes, 0.f);
        std::fill(value, value + P, 0.f);
        continue;
      }
      const T* row = in.k_cache + s.rows_at[t] + h * D;
      if (D == P) {  // whole pieces of kDotLanes: converted straight to their places
        for (int64_t b = 0; b < P / kDotLanes; ++b) to_float(row + b * kDotLanes, key + 2 * b * kDotLanes, kDotLanes);
      } else {  // through s.row, zero past D
        to_float(row, s.row.data(), D);
        for (int64_t b = 0; b < P / kDotLanes; ++b)
          std::memcpy(key + 2 * b * kDotLanes, s.row.data() + b * kDotLanes, kDotLanes * sizeof(float));
      }
      to_float(in.v_cache + s.rows_at[t] + h * D, value, D);
      std::fill(value + D, value + P, 0.f);
    }
  }
}

// A chunk's keys and values in fp32 tiles (load_tiles: keys in pair_key's layout, values
// [key][padded_dim]), as group_scores and weighted_values read them.
struct TileSource {
  const float* keys;
  const float* values;
  int64_t padded_dim;

  Vec pair(int64_t g, int k, int64_t v) const {
    return load(keys + g * kLanes * padded_dim + (k * 2 * padded_dim / kLanes + v) * kLanes);
  }
  Vec value(int64_t t, int64_t v) const { return load(values + t * padded_dim + v * kLanes); }
};

// A chunk's keys and values read where they lie in the cache (head_dim == padded_dim): per key of
// the chunk its key row and value row (cache_rows), rows past the chunk's keys a row of zeros, so
// the floats are those load_tiles would write.
template <typename T>
struct RowSource {
  const T* const* keys;
  const T* const* values;

  Vec pair(int64_t g, int k, int64_t v) const {
    const int64_t t = g * kLanes + 2 * k;
    return load_pair_as_float(keys[t] + v * kDotLanes, keys[t + 1] + v * kDotLanes);
  }
  Vec value(int64_t t, int64_t v) const { return load_as_float(values[t] + v * kLanes); }
};

// Reads every cache line of the chunk's rows of nh kv heads (row_offsets done), key after key: the
// rows lie side by side in a slot, so this streams them into the CPU's caches in whole runs, which
// the hardware prefetcher follows; the kv heads' passes over them then hit those caches.
template <typename T>
inline void touch_rows(const Inputs<T>& in, const Scratch& s, int64_t nh, int64_t head_dim, int64_t n) {
  uint32_t sink = 0;
  const int64_t bytes = nh * head_dim * static_cast<int64_t>(sizeof(T));
  for (int64_t t = 0; t < n; ++t) {
    const unsigned char* k = reinterpret_cast<const unsigned char*>(in.k_cache + s.rows_at[t]);
    const unsigned char* v = reinterpret_cast<const unsigned char*>(in.v_cache + s.rows_at[t]);
    for (int64_t b = 0; b < bytes; b += 64) sink += k[b] + v[b];
  }
  asm volatile("" : : "r"(sink));  // the loads happen
}

// RowSource of kv head h0 + h of the chunk (rows_at: row_offsets of h0 for n keys): num_keys (n rounded up
// to kLanes) row pointers each, those past n at `zeros` (padded_dim zeros). The pointers are this
// thread's until its next call.
template <typename T>
inline RowSource<T> cache_rows(const Problem& p, const Inputs<T>& in, const std::vector<int64_t>& rows_at, int64_t h,
                               int64_t n, const T* zeros) {
  thread_local std::vector<const T*> keys, values;
  const int64_t num_keys = (n + kLanes - 1) / kLanes * kLanes;
  keys.resize(num_keys);
  values.resize(num_keys);
  for (int64_t t = 0; t < num_keys; ++t) {
    keys[t] = t < n ? in.k_cache + rows_at[t] + h * p.head_dim : zeros;
    values[t] = t < n ? in.v_cache + rows_at[t] + h * p.head_dim : zeros;
  }
  return {keys.data(), values.data()};
}

}  // namespace draftwise_attention
