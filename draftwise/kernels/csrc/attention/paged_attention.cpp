// draftwise_cpu::paged_attention: causal attention of any number of query rows per sequence (decode,
// verify, tree, prefill and prefill-chunk rows alike) over the sequence's paged KV cache.
//
// Queries of sequence s are rows query_start[s] .. query_start[s + 1] - 1, the last rows of its
// context of context_lens[s] tokens, so query i sits at position context_lens[s] - num_queries + i
// and sees keys up to there (causal), and only the last sliding_window of them when
// sliding_window > 0. Keys and values are read block by block straight from the cache.
//
// Token trees: an optional tree_mask [num_tokens, 2] int64 gives each row (tree_start, bits). A row
// at position pos with tree_start <= pos sees key j <= pos where j < tree_start or bit j - tree_start
// of bits is set (its ancestors in a draft tree and itself; j - tree_start < 64); its sliding window
// ends at its logical position tree_start + popcount(bits) - 1 and limits only the keys before
// tree_start. Rows with tree_start > pos (NO_TREE = 1 << 62) are plain causal rows.
//
// One arithmetic per row. A row's output depends on its query, its position (window, tree bits) and
// the keys and values it sees, never on the rows beside it, how many query rows its sequence has
// this step, nor how the work is split; every path below computes exactly this, in fp32:
//  * keys are taken in chunks of kChunkKeys positions counted from 0, a chunk in groups of kLanes;
//    keys a row does not see get weight 0 (and score -inf), which changes no sum.
//  * score = (query x scale) . key: kDotLanes partial sums over the head dim (lane l sums d = l,
//    l + kDotLanes, ... in order, multiply-adds), then the lanes summed by one fixed tree (lane l
//    with l + 4, then + 2, + 1).
//  * per chunk: m = max score, weights exp(score - m) (exp_lanes), their sum by lanes over the
//    groups in order then the same tree, and acc = sum of weight x value over the keys in order.
//    A tree row's weights are summed at their logical positions (its ancestors packed after
//    tree_start), so its sums match plain decoding at that position; the scheduler keeps a
//    tree's slots and positions in one chunk (TokenTree.chunk_aligned).
//  * chunks merged in order (merge_chunk), then out = acc / sum.
// This file is compiled without -ffast-math (native.py), so the compiler keeps that order.
//
// Work: a sequence with at most kShortQuery query rows is split by (kv head, chunk), flash-decoding
// style, so one long context still keeps every core busy, and the item that finishes a (sequence,
// kv head) last merges its chunks; the items of one chunk are computed together for all the kv
// heads (a unit), whose rows lie side by side in each slot, so the cache streams in whole rows; a
// longer query (prefill) is split by (kv head, kRowBlock query rows), each item walking its chunks. Both orders of work compute the arithmetic above, bit for bit
// (tests/test_row_invariance.py). The vector code uses GCC's __builtin_shuffle: another compiler
// fails the build, and native.py then keeps torch's SDPA.
#include "paged_attention.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "attention_chunk.h"

namespace {

using namespace draftwise_attention;

constexpr int64_t kShortQuery = 16;  // sequences with at most this many query rows split by chunk
constexpr int64_t kRowBlock = 64;    // query rows per item of a longer query

// Past the last key of the chunk at `first` that any row of `s.rows` sees (prepare_rows done).
int64_t chunk_end(const Scratch& s, int64_t first) {
  int64_t end = first;
  for (const RowKeys& keys : s.rows) end = std::max(end, std::min(keys.hi, first + kChunkKeys));
  return end;
}

// One chunk [first, first + kChunkKeys) for every row of `span` (prepare_rows done): each row's
// (max, sum, acc) into `out`.
template <typename T, int kVecs>
void attend_chunk(const Problem& p, const Inputs<T>& in, const Span& span, int64_t first, Scratch& s,
                  const Partial& out) {
  const int64_t end = chunk_end(s, first);
  if (end > first) load_tiles(p, in, span.seq, span.kv_head, 1, first, end - first, s);
  attend_tiles<kVecs>(p, first, end, TileSource{s.keys.data(), s.values.data(), p.padded_dim}, s, out);
}

// Runs `work(i)` for i in [0, n) on torch's threads, each taking the next item when it is free.
template <typename F>
void dynamic_for(int64_t n, const F& work) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(n, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    for (int64_t i = next++; i < n; i = next++) work(i);
  });
}

// The first chunk any row of sequence s may see (its window's, or a tree row's earlier one).
int64_t first_chunk(const Problem& p, int64_t s) {
  const int64_t q0 = p.starts[s], num_q = p.starts[s + 1] - q0, ctx = p.lens[s];
  int64_t first = ctx;
  for (int64_t i = 0; i < num_q; ++i) first = std::min(first, row_keys(p, q0 + i, ctx - num_q + i).lo);
  return first / kChunkKeys * kChunkKeys;
}

// out rows of a span from each row's merged (sum, acc).
template <typename T>
void write_rows(const Problem& p, const Span& span, const float* sum, const float* acc, T* out) {
  const int64_t q0 = p.starts[span.seq], D = p.head_dim, P = p.padded_dim;
  for (int64_t r = 0; r < span.count * p.group; ++r) {
    const int64_t i = span.first + r / p.group, head = span.kv_head * p.group + r % p.group;
    T* dst = out + ((q0 + i) * p.num_heads + head) * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(sum[r] > 0.f ? acc[r * P + d] / sum[r] : 0.f);
  }
}

// A long query: items of kRowBlock rows, each walking its chunks and merging them as it goes.
template <typename T, int kVecs>
void attend_rows(const Problem& p, const Inputs<T>& in, const Span& span, T* out) {
  thread_local Scratch s;
  thread_local std::vector<float> state, chunk;
  prepare_rows(p, in, span, s);
  const int64_t rows = span.count * p.group, P = p.padded_dim;
  state.assign(rows * (2 + P), 0.f);  // per row: max, sum, acc
  chunk.resize(rows * (2 + P));
  float *max = state.data(), *sum = max + rows, *acc = sum + rows;
  std::fill(max, max + rows, kMinusInf);
  const Partial part{chunk.data(), chunk.data() + rows, chunk.data() + 2 * rows};
  int64_t first = p.lens[span.seq], end = 0;
  for (const RowKeys& keys : s.rows) first = std::min(first, keys.lo), end = std::max(end, keys.hi);
  for (int64_t c = first / kChunkKeys * kChunkKeys; c < end; c += kChunkKeys) {
    attend_chunk<T, kVecs>(p, in, span, c, s, part);
    for (int64_t r = 0; r < rows; ++r)
      merge_chunk(max[r], sum[r], acc + r * P, part.max[r], part.sum[r], part.acc + r * P, P);
  }
  write_rows(p, span, sum, acc, out);
}

// Work of short queries: one chunk of keys of consecutive kv heads of one sequence (spans
// [span, span + num_spans), their chunk-th chunk), loaded together: a slot's rows of those heads
// lie side by side, so they stream as one run per key.
struct Unit {
  int64_t span, num_spans, chunk;
};

// The units of `spans` (per sequence, its kv heads in order; span_items: each span's first item),
// chunk by chunk: every kv head of a sequence in one unit, so a key's rows are one contiguous run
// of the cache (the run the hardware prefetcher follows), fewer heads where the units would not
// give every thread two.
std::vector<Unit> chunk_units(const Problem& p, const std::vector<Span>& spans, const std::vector<int64_t>& span_items) {
  const int64_t num_spans = static_cast<int64_t>(spans.size());
  std::vector<Unit> units;
  int64_t heads = p.num_kv_heads;
  for (;; heads = (heads + 1) / 2) {
    units.clear();
    for (int64_t i = 0; i < num_spans;) {
      int64_t j = i;
      while (j < num_spans && spans[j].seq == spans[i].seq) ++j;
      for (int64_t k = 0; k < span_items[i + 1] - span_items[i]; ++k)
        for (int64_t g = i; g < j; g += heads) units.push_back({g, std::min(heads, j - g), k});
      i = j;
    }
    if (heads == 1 || static_cast<int64_t>(units.size()) >= 2 * at::get_num_threads()) return units;
  }
}

// Short queries: one item per (sequence, kv head, chunk), computed by units of several kv heads;
// the item that finishes a (sequence, kv head) last merges its chunks, in chunk order.
template <typename T, int kVecs>
void attend_chunks(const Problem& p, const Inputs<T>& in, const std::vector<Span>& spans, T* out) {
  struct Item { int64_t span, first, offset; };  // offset: first row of its partial results
  std::vector<Item> items;
  std::vector<int64_t> span_items{0};
  int64_t num_rows = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(spans.size()); ++i) {
    const Span& span = spans[i];
    for (int64_t c = first_chunk(p, span.seq); c < p.lens[span.seq]; c += kChunkKeys) {
      items.push_back({i, c, num_rows});
      num_rows += span.count * p.group;
    }
    span_items.push_back(static_cast<int64_t>(items.size()));
  }
  const int64_t P = p.padded_dim;
  std::vector<float> max(num_rows), sum(num_rows), acc(num_rows * P);
  std::unique_ptr<std::atomic<int64_t>[]> pending(new std::atomic<int64_t>[spans.size()]);
  for (size_t i = 0; i < spans.size(); ++i) pending[i] = span_items[i + 1] - span_items[i];
  auto merge = [&](int64_t i) {
    thread_local std::vector<float> state;
    const int64_t rows = spans[i].count * p.group;
    state.assign(rows * (2 + P), 0.f);
    float *row_max = state.data(), *row_sum = row_max + rows, *row_acc = row_sum + rows;
    std::fill(row_max, row_max + rows, kMinusInf);
    for (int64_t k = span_items[i]; k < span_items[i + 1]; ++k)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t at = items[k].offset + r;
        merge_chunk(row_max[r], row_sum[r], row_acc + r * P, max[at], sum[at], acc.data() + at * P, P);
      }
    write_rows(p, spans[i], row_sum, row_acc, out);
  };
  const std::vector<Unit> units = chunk_units(p, spans, span_items);
  dynamic_for(static_cast<int64_t>(units.size()), [&](int64_t u) {
    thread_local Scratch s;
    thread_local std::vector<T> zeros;
    const Unit& unit = units[u];
    const Span& lead = spans[unit.span];
    const int64_t first = items[span_items[unit.span] + unit.chunk].first;
    prepare_rows(p, in, lead, s);  // the unit's spans share their rows' keys (one sequence)
    const int64_t end = chunk_end(s, first), n = end - first, tile = tile_floats(p, n);
    // Read where they lie when a head's rows are one score block (each key converted once per block);
    // more rows amortize converting the chunk into tiles once. Both give the same floats.
    const bool in_place = p.head_dim == P && lead.count * p.group <= kScoreRows;
    if (in_place) {
      if (static_cast<int64_t>(zeros.size()) < P) zeros.assign(P, T(0.f));
      row_offsets(p, lead.seq, lead.kv_head, first, n, s.rows_at);
      touch_rows(in, s, unit.num_spans, p.head_dim, n);
    } else if (n > 0) {
      load_tiles(p, in, lead.seq, lead.kv_head, unit.num_spans, first, n, s);
    }
    for (int64_t h = 0; h < unit.num_spans; ++h) {
      const int64_t i = unit.span + h, offset = items[span_items[i] + unit.chunk].offset;
      if (h > 0) prepare_rows(p, in, spans[i], s);
      const Partial part{max.data() + offset, sum.data() + offset, acc.data() + offset * P};
      if (in_place) {
        attend_tiles<kVecs>(p, first, end, cache_rows(p, in, s.rows_at, h, n, zeros.data()), s, part);
      } else {
        attend_tiles<kVecs>(p, first, end, TileSource{s.keys.data() + h * tile, s.values.data() + h * tile, P}, s,
                            part);
      }
      if (pending[i].fetch_sub(1, std::memory_order_acq_rel) == 1) merge(i);
    }
  });
}

template <typename T, int kVecs>
void run(const Problem& p, const Inputs<T>& in, T* out, int64_t num_seqs) {
  std::vector<Span> short_spans, long_spans;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t num_q = p.starts[s + 1] - p.starts[s];
    for (int64_t h = 0; h < p.num_kv_heads; ++h) {
      if (num_q <= kShortQuery) {
        short_spans.push_back({s, h, 0, num_q});
        continue;
      }
      for (int64_t first = 0; first < num_q; first += kRowBlock)
        long_spans.push_back({s, h, first, std::min(kRowBlock, num_q - first)});
    }
  }
  if (!short_spans.empty()) attend_chunks<T, kVecs>(p, in, short_spans, out);
  std::sort(long_spans.begin(), long_spans.end(),  // the rows with most keys first: balanced threads
            [](const Span& a, const Span& b) { return a.first > b.first; });
  dynamic_for(static_cast<int64_t>(long_spans.size()),
              [&](int64_t i) { attend_rows<T, kVecs>(p, in, long_spans[i], out); });
}

template <typename T>
void run_for_dim(const Problem& p, const T* q, const T* kv, T* out, int64_t num_seqs) {
  const Inputs<T> in{q, kv, kv + p.num_slots * p.num_kv_heads * p.head_dim};
  if (p.padded_dim == 64) return run<T, 4>(p, in, out, num_seqs);
  if (p.padded_dim == 128) return run<T, 8>(p, in, out, num_seqs);
  run<T, 0>(p, in, out, num_seqs);
}

// Every tree row's tree_start is >= 0 and its keys from tree_start on fit the 64 bits.
void check_tree(const Problem& p, int64_t num_seqs) {
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int64_t i = p.starts[s]; i < p.starts[s + 1]; ++i) {
      const int64_t pos = p.lens[s] - (p.starts[s + 1] - i), tree_start = p.tree[2 * i];
      TORCH_CHECK(tree_start >= 0 && (tree_start > pos || pos - tree_start < 64), "paged_attention: row ", i,
                  " at position ", pos, " has tree_start ", tree_start, " (must be in (pos - 64, pos] or past pos)");
    }
}

}  // namespace

namespace draftwise_cpu_kernels {

at::Tensor paged_attention_cpu(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_table,
                               const at::Tensor& query_start, const at::Tensor& context_lens, int64_t block_size,
                               double scale, int64_t sliding_window, const std::optional<at::Tensor>& tree_mask) {
  TORCH_CHECK(q.is_contiguous() && kv_cache.is_contiguous(), "q and kv_cache must be contiguous");
  TORCH_CHECK(q.scalar_type() == kv_cache.scalar_type(), "q and kv_cache must share a dtype");
  auto table = block_table.contiguous(), starts = query_start.contiguous(), lens = context_lens.contiguous();
  at::Tensor tree;
  if (tree_mask.has_value()) {
    tree = tree_mask->contiguous();
    TORCH_CHECK(tree.scalar_type() == at::kLong && tree.dim() == 2 && tree.size(0) == q.size(0) && tree.size(1) == 2,
                "paged_attention: tree_mask must be [num_tokens, 2] int64");
  }
  TORCH_CHECK(q.dim() == 3 && starts.size(0) == lens.size(0) + 1 && starts[-1].item<int64_t>() == q.size(0),
              "paged_attention: q [num_tokens, num_heads, head_dim] must hold query_start[-1] rows");
  const int64_t num_heads = q.size(1), num_kv_heads = kv_cache.size(2), head_dim = q.size(2);
  const Problem problem{num_heads, num_kv_heads, num_heads / num_kv_heads, head_dim,
                        (head_dim + kLanes - 1) / kLanes * kLanes, block_size, table.size(1), kv_cache.size(1),
                        sliding_window, static_cast<float>(scale), table.data_ptr<int64_t>(),
                        starts.data_ptr<int64_t>(), lens.data_ptr<int64_t>(),
                        tree.defined() ? tree.data_ptr<int64_t>() : nullptr};
  for (int64_t s = 0; s < lens.size(0); ++s) {
    const int64_t num_q = problem.starts[s + 1] - problem.starts[s], ctx = problem.lens[s];
    TORCH_CHECK(0 <= num_q && num_q <= ctx && (ctx + block_size - 1) / block_size <= problem.table_width,
                "paged_attention: sequence ", s, " (", num_q, " query rows, ", ctx, " keys) does not fit its ",
                problem.table_width, " blocks of ", block_size);
  }
  if (tree.defined()) check_tree(problem, lens.size(0));
  at::Tensor out = at::empty_like(q);
  if (q.scalar_type() == at::kBFloat16) {
    run_for_dim(problem, q.data_ptr<c10::BFloat16>(), kv_cache.data_ptr<c10::BFloat16>(),
                out.data_ptr<c10::BFloat16>(), lens.size(0));
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "paged_attention_cpu takes bfloat16 or float32");
    run_for_dim(problem, q.data_ptr<float>(), kv_cache.data_ptr<float>(), out.data_ptr<float>(), lens.size(0));
  }
  return out;
}

}  // namespace draftwise_cpu_kernels

TORCH_LIBRARY_FRAGMENT(draftwise_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor kv_cache, Tensor block_table, Tensor query_start, "
        "Tensor context_lens, int block_size, float scale, int sliding_window, Tensor? tree_mask=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftwise_cpu, CPU, m) { m.impl("paged_attention", draftwise_cpu_kernels::paged_attention_cpu); }
