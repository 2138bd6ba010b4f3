// One chunk's arithmetic for the rows of a span (paged_attention.cpp's contract): scores in blocks
// of query rows, softmax weights, weighted values, for one kv head from a TileSource or a RowSource
// (attend_tiles). Used by paged_attention.cpp only; compiled without -ffast-math there.
#pragma once

#include "attention_tiles.h"

#include <tuple>
#include <vector>

namespace draftwise_attention {

#if defined(__AVX512F__)
constexpr int kScoreRows = 4;  // query rows scored together (their queries and 4 keys' pairs in registers)
#else
constexpr int kScoreRows = 1;
#endif

// Scores of rows [r, r + kRows) (prepare_rows done, s.seen set) over the groups each sees, into s.weights.
template <int kVecs, int kRows, typename Keys>
void score_block(const Problem& p, int64_t r, int64_t num_groups, const Keys& keys, Scratch& s) {
  const int64_t P = p.padded_dim;
  int64_t groups = 0;
  for (int i = 0; i < kRows; ++i) groups = std::max(groups, s.seen[r + i] / kLanes);
  Vec scores[kRows];
  for (int64_t g = 0; g < groups; ++g) {
    group_scores<kVecs, kRows>(s.query.data() + r * 2 * P, P, keys, g, scores);
    for (int i = 0; i < kRows; ++i)
      if (g * kLanes < s.seen[r + i]) store(s.weights.data() + ((r + i) * num_groups + g) * kLanes, scores[i]);
  }
}

// s.seen (keys of the chunk [first, first + num_groups * kLanes) each row sees, in whole groups) and
// s.weights at -inf past them; room for the scores.
inline void begin_scores(int64_t first, int64_t num_groups, Scratch& s) {
  const int64_t num_rows = static_cast<int64_t>(s.rows.size());
  s.weights.resize(num_rows * num_groups * kLanes);
  s.packed.resize(kChunkKeys);
  s.seen.resize(num_rows);
  for (int64_t r = 0; r < num_rows; ++r) {
    const RowKeys& row = s.rows[r];
    const int64_t row_groups = row.hi <= first ? 0 : std::min(num_groups, (row.hi - first + kLanes - 1) / kLanes);
    s.seen[r] = row_groups * kLanes;
    float* w = s.weights.data() + r * num_groups * kLanes;
    std::fill(w + row_groups * kLanes, w + num_groups * kLanes, kMinusInf);
  }
}

// Each row's scores into softmax weights in place, its (max, sum) into out.
inline void chunk_weights(int64_t first, int64_t num_groups, Scratch& s, const Partial& out) {
  for (int64_t r = 0; r < static_cast<int64_t>(s.rows.size()); ++r)
    std::tie(out.max[r], out.sum[r]) =
        row_weights(s.weights.data() + r * num_groups * kLanes, num_groups, first, s.rows[r], s.packed.data());
}

// The chunk [first, end) for every row of `span` (prepare_rows done) from its kv head's keys and
// values (TileSource or RowSource of end - first keys): each row's (max, sum, acc) into `out`.
template <int kVecs, typename Keys>
void attend_tiles(const Problem& p, int64_t first, int64_t end, const Keys& keys, Scratch& s, const Partial& out) {
  const int64_t num_rows = static_cast<int64_t>(s.rows.size());
  const int64_t num_groups = (end - first + kLanes - 1) / kLanes;
  if (num_groups == 0 || end <= first) {
    std::fill(out.sum, out.sum + num_rows, 0.f);
    return;
  }
  begin_scores(first, num_groups, s);
  int64_t r = 0;
  for (; r + kScoreRows <= num_rows; r += kScoreRows) score_block<kVecs, kScoreRows>(p, r, num_groups, keys, s);
  const int64_t rest = num_rows - r;  // fewer than kScoreRows: one block, each key pair loaded once for them
  if (rest == 3) score_block<kVecs, 3>(p, r, num_groups, keys, s);
  if (rest == 2) score_block<kVecs, 2>(p, r, num_groups, keys, s);
  if (rest == 1) score_block<kVecs, 1>(p, r, num_groups, keys, s);
  chunk_weights(first, num_groups, s, out);
  weighted_values<kVecs>(s.weights.data(), num_rows, num_groups * kLanes, s.seen.data(), keys, p.padded_dim,
                         out.acc);
}

}  // namespace draftwise_attention
