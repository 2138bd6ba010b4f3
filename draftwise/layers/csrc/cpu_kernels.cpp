// draftwise_cpu::paged_attention: attention of a few query rows per sequence over its paged KV cache
// (and draftwise_cpu::rms_norm and draftwise_cpu::packed_linear, at the end).
//
// Queries of sequence s are rows query_start[s] .. query_start[s + 1] - 1, the last rows of its
// context of context_lens[s] tokens, so query i sits at position context_lens[s] - num_queries + i
// and sees keys up to there (causal), and only the last sliding_window of them when
// sliding_window > 0. Keys and values are read block by block straight from the cache (no
// gathered copy, no fp32 copy of the context); everything accumulates in fp32.
//
// Token trees: an optional tree_mask [num_tokens, 2] int64 gives each row (tree_start, bits). A row
// at position pos with tree_start <= pos sees key j <= pos where j < tree_start or bit j - tree_start
// of bits is set (its ancestors in a draft tree and itself; j - tree_start < 64); its sliding window
// ends at its logical position tree_start + popcount(bits) - 1 and limits only the keys before
// tree_start. Rows with tree_start > pos (NO_TREE = 1 << 62) are plain causal rows.
//
// Work is split as flash-decoding does: over (sequence, kv head, chunk of kChunkKeys keys), so one
// long sequence still keeps every core busy, and threads take items dynamically. An item converts
// each block's keys / values to fp32 once and shares them between all its query rows (its
// queries times the kv head's query heads); it leaves each row's max score, exp-sum and unnormalised
// output, and a second pass merges the chunks of each row. Head dims 64 and 128 are compiled with
// the dim fixed, so a row's accumulator stays in registers.
#include "paged_attention.h"
#include "rms_norm.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kChunkKeys = 128;  // keys per work item
constexpr float kNoScore = -1e30f;   // max score of a row with no visible key in a chunk

struct Problem {
  int64_t num_heads, num_kv_heads, group, head_dim, block_size, table_width, num_slots;
  int64_t sliding_window;
  float scale;
  const int64_t* table;   // [num_seqs, table_width]
  const int64_t* starts;  // [num_seqs + 1]
  const int64_t* lens;    // [num_seqs]
  const int64_t* tree;    // [num_tokens, 2] (tree_start, bits) per row; nullptr: every row causal
};

struct Item {
  int64_t seq, kv_head, first_key, end_key;
  int64_t row_offset;  // first row of this item's partial results (rows of all items laid end to end)
};

inline void to_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void to_float(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(dst + i, &word, sizeof(float));
  }
}

// The keys query row `token` at position `pos` sees, clipped to [first, end): [lo, hi), less, in a
// tree row, the keys from tree_start on whose bit is clear.
struct RowKeys {
  int64_t lo, hi;
  bool tree;           // a tree row: the bits apply
  int64_t tree_start;  // tree rows only
  uint64_t bits;
};

inline RowKeys row_keys(const Problem& p, int64_t token, int64_t pos, int64_t first, int64_t end) {
  const int64_t tree_start = p.tree != nullptr ? p.tree[2 * token] : pos + 1;
  RowKeys keys{first, std::min(end, pos + 1), tree_start <= pos, tree_start, 0};
  if (keys.tree) keys.bits = static_cast<uint64_t>(p.tree[2 * token + 1]);
  if (p.sliding_window > 0) {
    const int64_t logical = keys.tree ? tree_start + std::popcount(keys.bits) - 1 : pos;
    const int64_t window_lo = logical - p.sliding_window + 1;  // the tree region keeps its bits
    keys.lo = std::max(first, keys.tree ? std::min(window_lo, tree_start) : window_lo);
  }
  return keys;
}

// Softmax numerators of a tree row's keys [lo, hi) of `row` (scores; lo, hi relative to `row`, whose
// key 0 is `first_key`), the keys its bits show packed in order at the front of `numerators` and their
// offsets from `lo` in `shown`; returns (their max, their count). Packed, a row computes exactly as a
// causal row over the same keys does (same trip counts, same order), so a tree row's output equals
// plain decoding's at that position.
inline std::pair<float, int64_t> tree_numerators(const float* row, int64_t lo, int64_t hi, int64_t first_key,
                                                 const RowKeys& keys, float* numerators, int64_t* shown) {
  int64_t count = 0;
  for (int64_t j = lo; j < hi; ++j) {
    const int64_t offset = first_key + j - keys.tree_start;
    if (offset < 0 || ((keys.bits >> offset) & 1) != 0) shown[count++] = j - lo;
  }
  float top = kNoScore;
  for (int64_t c = 0; c < count; ++c) top = std::max(top, row[lo + shown[c]]);
  for (int64_t c = 0; c < count; ++c) numerators[c] = row[lo + shown[c]] - top;
  for (int64_t c = 0; c < count; ++c) numerators[c] = std::exp(numerators[c]);
  return {top, count};
}

// Softmax numerators of a causal row's keys [lo, hi) of `row` into `numerators`; returns their max.
inline float causal_numerators(const float* row, int64_t lo, int64_t hi, float* numerators) {
  float top = kNoScore;
  for (int64_t j = lo; j < hi; ++j) top = std::max(top, row[j]);
  const int64_t seen = std::max<int64_t>(0, hi - lo);
  for (int64_t j = 0; j < seen; ++j) numerators[j] = row[lo + j] - top;
  for (int64_t j = 0; j < seen; ++j) numerators[j] = std::exp(numerators[j]);
  return top;
}

// One item: scores, per-row softmax statistics and the unnormalised output of its chunk of keys.
template <typename T, int kDim>
void attend_chunk(const Problem& p, const T* q, const T* k_cache, const T* v_cache, const Item& it,
                  float* acc, float* row_max, float* row_sum, std::vector<float>& scratch) {
  const int64_t D = kDim > 0 ? kDim : p.head_dim;
  const int64_t q0 = p.starts[it.seq], num_q = p.starts[it.seq + 1] - q0, ctx = p.lens[it.seq];
  const int64_t rows = num_q * p.group, num_keys = it.end_key - it.first_key;
  scratch.resize(rows * D + rows * num_keys + p.block_size * D);
  float* query = scratch.data();             // [rows, D], scaled
  float* scores = query + rows * D;          // [rows, num_keys]
  float* tile = scores + rows * num_keys;    // [block_size, D]: one block's keys or values in fp32
  for (int64_t i = 0; i < num_q; ++i)
    for (int64_t g = 0; g < p.group; ++g) {
      float* dst = query + (i * p.group + g) * D;
      to_float(q + ((q0 + i) * p.num_heads + it.kv_head * p.group + g) * D, dst, D);
      for (int64_t d = 0; d < D; ++d) dst[d] *= p.scale;
    }
  const int64_t stride = p.num_kv_heads * D;  // between consecutive slots
  auto rows_at = [&](const T* cache, int64_t j) {  // this kv head's row of key / value j
    const int64_t block = p.table[it.seq * p.table_width + j / p.block_size];
    return cache + ((block * p.block_size + j % p.block_size) * p.num_kv_heads + it.kv_head) * D;
  };
  auto prefetch = [&](const T* cache, int64_t j) {  // the block of key j, on its way to the cache
    if (j >= it.end_key) return;
    const T* src = rows_at(cache, j);
    for (int64_t t = 0; t < std::min(p.block_size - j % p.block_size, it.end_key - j); ++t)
      for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(T)); byte += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(src + t * stride) + byte);
  };
  // body(first key of the block within the chunk, number of keys) for each block, its rows in `tile`;
  // the next block of `cache` and this block of `upcoming` (the values, while keys are read) prefetched.
  auto for_each_block = [&](const T* cache, const T* upcoming, auto&& body) {
    for (int64_t j = it.first_key; j < it.end_key;) {
      const int64_t n = std::min(p.block_size - j % p.block_size, it.end_key - j);
      prefetch(cache, j + n);
      if (upcoming != nullptr) prefetch(upcoming, j);
      const T* src = rows_at(cache, j);
      for (int64_t t = 0; t < n; ++t) to_float(src + t * stride, tile + t * D, D);
      body(j - it.first_key, n);
      j += n;
    }
  };
  prefetch(k_cache, it.first_key);
  for_each_block(k_cache, v_cache, [&](int64_t first, int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = query + r * D;
      float* out = scores + r * num_keys + first;
      for (int64_t t = 0; t < n; ++t) {
        const float* key = tile + t * D;
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d) dot += qr[d] * key[d];
        out[t] = dot;
      }
    }
  });
  for (int64_t r = 0; r < rows; ++r) {  // softmax numerators over the visible keys; 0 elsewhere
    const RowKeys keys = row_keys(p, q0 + r / p.group, ctx - num_q + r / p.group, it.first_key, it.end_key);
    float* row = scores + r * num_keys;
    const int64_t lo = keys.lo - it.first_key, hi = keys.hi - it.first_key;
    // exp and sum over the visible keys alone, in an aligned buffer: a row's numbers then depend on
    // its own keys only, not on how many keys the chunk holds past them (more when its sequence
    // verifies several rows this step) nor where the row sits in `scores` (vectorized loops split
    // their work into body and tail by trip count and alignment).
    alignas(64) float numerators[kChunkKeys];
    int64_t shown[kChunkKeys];
    int64_t seen = std::max<int64_t>(0, hi - lo);
    float top;
    if (keys.tree) {
      std::tie(top, seen) = tree_numerators(row, lo, hi, it.first_key, keys, numerators, shown);
    } else {
      top = causal_numerators(row, lo, hi, numerators);
    }
    float total = 0.f;
    for (int64_t j = 0; j < seen; ++j) total += numerators[j];
    std::fill(row, row + num_keys, 0.f);
    if (keys.tree) {
      for (int64_t c = 0; c < seen; ++c) row[lo + shown[c]] = numerators[c];
    } else {
      std::memcpy(row + lo, numerators, seen * sizeof(float));  // lo >= 0: row_keys() clips to the chunk
    }
    row_max[r] = top, row_sum[r] = total;
  }
  std::fill(acc, acc + rows * D, 0.f);
  for_each_block(v_cache, nullptr, [&](int64_t first, int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* weights = scores + r * num_keys + first;
      float sum[kDim > 0 ? kDim : 1];
      float* a = kDim > 0 ? sum : acc + r * D;
      if (kDim > 0) std::memcpy(sum, acc + r * D, D * sizeof(float));
      for (int64_t t = 0; t < n; ++t) {
        const float w = weights[t];
        const float* value = tile + t * D;
        for (int64_t d = 0; d < D; ++d) a[d] += w * value[d];
      }
      if (kDim > 0) std::memcpy(acc + r * D, sum, D * sizeof(float));
    }
  });
}

// out[row] = the chunks' outputs of that row, each weighted by exp(its max - the overall max), / the sum.
template <typename T>
void merge_chunks(const Problem& p, const std::vector<Item>& items, int64_t first_item, int64_t num_items,
                  const float* acc, const float* row_max, const float* row_sum, T* out) {
  const Item& head = items[first_item];
  const int64_t q0 = p.starts[head.seq], num_q = p.starts[head.seq + 1] - q0, rows = num_q * p.group;
  const int64_t D = p.head_dim;
  std::vector<float> result(D);
  for (int64_t r = 0; r < rows; ++r) {
    float top = kNoScore;
    for (int64_t c = 0; c < num_items; ++c) {
      const int64_t at = items[first_item + c].row_offset + r;
      if (row_sum[at] > 0.f) top = std::max(top, row_max[at]);
    }
    float total = 0.f;
    std::fill(result.begin(), result.end(), 0.f);
    for (int64_t c = 0; c < num_items; ++c) {
      const int64_t at = items[first_item + c].row_offset + r;
      if (row_sum[at] <= 0.f) continue;
      const float weight = std::exp(row_max[at] - top);
      total += weight * row_sum[at];
      for (int64_t d = 0; d < D; ++d) result[d] += weight * acc[at * D + d];
    }
    T* dst = out + ((q0 + r / p.group) * p.num_heads + head.kv_head * p.group + r % p.group) * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(result[d] / total);
  }
}

// Runs `work(i)` for i in [0, n) on torch's threads, each taking the next item when it is free.
template <typename F>
void dynamic_for(int64_t n, const F& work) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(n, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    for (int64_t i = next++; i < n; i = next++) work(i);
  });
}

// The first key of sequence s that a query row of it may see: the first row's window start, or
// earlier where a tree row's window (from its logical position) starts earlier.
int64_t first_key(const Problem& p, int64_t s) {
  const int64_t q0 = p.starts[s], num_q = p.starts[s + 1] - q0, ctx = p.lens[s];
  if (p.sliding_window <= 0) return 0;
  int64_t first = std::max<int64_t>(0, ctx - num_q + 1 - p.sliding_window);
  for (int64_t i = 0; i < num_q && p.tree != nullptr; ++i)
    first = std::min(first, row_keys(p, q0 + i, ctx - num_q + i, 0, ctx).lo);
  return first;
}

template <typename T, int kDim>
void run(const Problem& p, const T* q, const T* kv, T* out, int64_t num_seqs) {
  const T* k_cache = kv;
  const T* v_cache = kv + p.num_slots * p.num_kv_heads * p.head_dim;
  std::vector<Item> items;
  std::vector<int64_t> heads;  // first item of each (sequence, kv head)
  int64_t num_rows = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t num_q = p.starts[s + 1] - p.starts[s], ctx = p.lens[s], rows = num_q * p.group;
    const int64_t first = first_key(p, s);
    for (int64_t h = 0; h < p.num_kv_heads; ++h) {
      heads.push_back(static_cast<int64_t>(items.size()));
      for (int64_t j = first; j < ctx; j += kChunkKeys) {
        items.push_back({s, h, j, std::min(ctx, j + kChunkKeys), num_rows});
        num_rows += rows;
      }
    }
  }
  heads.push_back(static_cast<int64_t>(items.size()));
  std::vector<float> acc(num_rows * p.head_dim), row_max(num_rows), row_sum(num_rows);
  dynamic_for(static_cast<int64_t>(items.size()), [&](int64_t i) {
    thread_local std::vector<float> scratch;
    const Item& it = items[i];
    attend_chunk<T, kDim>(p, q, k_cache, v_cache, it, acc.data() + it.row_offset * p.head_dim,
                          row_max.data() + it.row_offset, row_sum.data() + it.row_offset, scratch);
  });
  dynamic_for(static_cast<int64_t>(heads.size()) - 1, [&](int64_t i) {
    merge_chunks<T>(p, items, heads[i], heads[i + 1] - heads[i], acc.data(), row_max.data(), row_sum.data(),
                    out);
  });
}

template <typename T>
void run_for_dim(const Problem& p, const T* q, const T* kv, T* out, int64_t num_seqs) {
  if (p.head_dim == 64) return run<T, 64>(p, q, kv, out, num_seqs);
  if (p.head_dim == 128) return run<T, 128>(p, q, kv, out, num_seqs);
  run<T, 0>(p, q, kv, out, num_seqs);
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
  const int64_t num_heads = q.size(1), num_kv_heads = kv_cache.size(2);
  const Problem problem{num_heads, num_kv_heads, num_heads / num_kv_heads, q.size(2), block_size,
                        table.size(1), kv_cache.size(1), sliding_window, static_cast<float>(scale),
                        table.data_ptr<int64_t>(), starts.data_ptr<int64_t>(), lens.data_ptr<int64_t>(),
                        tree.defined() ? tree.data_ptr<int64_t>() : nullptr};
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

namespace {

using draftwise_cpu_kernels::paged_attention_cpu;

// x * rsqrt(mean(x^2) + eps) * weight over the last dim of fp32 rows: one call instead of torch's
// five ops (pow, mean, add, rsqrt, mul), which dominate the norm's time at a few rows.
at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "rms_norm takes float32");
  auto input = x.contiguous();
  const int64_t dim = input.size(-1), num_rows = input.numel() / dim;
  TORCH_CHECK(weight.numel() == dim, "rms_norm: weight size ", weight.numel(), " != ", dim);
  at::Tensor out = at::empty_like(input);
  const float* src = input.data_ptr<float>();
  const float* w = weight.contiguous().data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, num_rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      draftwise_cpu_kernels::rms_norm_row(src + r * dim, dim, w, static_cast<float>(eps), dst + r * dim);
  });
  return out;
}

// A PackedLinear's oneDNN kernel (mkldnn::_linear_pointwise on its prepacked weight) as an op of this
// library: a compiled graph's C++ wrapper calls it directly, with no Python call per linear.
at::Tensor packed_linear_cpu(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  static const c10::OperatorHandle linear =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack{x, packed, bias, c10::IValue(std::string("none")),
                                 c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string(""))};
  linear.callBoxed(&stack);
  return stack[0].toTensor();
}

}  // namespace

TORCH_LIBRARY(draftwise_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor kv_cache, Tensor block_table, Tensor query_start, "
        "Tensor context_lens, int block_size, float scale, int sliding_window, Tensor? tree_mask=None) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, &paged_attention_cpu);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.impl("rms_norm", c10::DispatchKey::CPU, &rms_norm_cpu);
  m.def("packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.impl("packed_linear", c10::DispatchKey::CPU, &packed_linear_cpu);
  m.impl("packed_linear", c10::DispatchKey::MkldnnCPU, &packed_linear_cpu);
}
