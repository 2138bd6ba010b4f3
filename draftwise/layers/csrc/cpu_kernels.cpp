// draftwise_cpu::paged_attention: attention of a few query rows per sequence over its paged KV cache
// (and draftwise_cpu::rms_norm, at the end).
//
// Reads each sequence's keys and values block by block straight from the cache (no gathered copy,
// no fp32 copy of the context) and accumulates in fp32. Queries of sequence s are rows
// query_start[s] .. query_start[s + 1] - 1, the last rows of its context of context_lens[s] tokens,
// so query i sits at position context_lens[s] - num_queries + i and sees keys up to there (causal),
// and only the last sliding_window of them when sliding_window > 0.
// Work is split over (sequence, kv head): every query row of that kv head (its queries times its
// query heads) shares each key and value it loads, converted to fp32 once.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

template <typename T>
void run(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_table,
         const at::Tensor& query_start, const at::Tensor& context_lens, int64_t block_size, double scale,
         int64_t sliding_window, at::Tensor& out) {
  const int64_t num_seqs = context_lens.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = kv_cache.size(2), group = num_heads / num_kv_heads;
  const int64_t num_slots = kv_cache.size(1), table_width = block_table.size(1);
  const T* q_ptr = q.data_ptr<T>();
  const T* k_ptr = kv_cache.data_ptr<T>();
  const T* v_ptr = k_ptr + num_slots * num_kv_heads * head_dim;
  T* out_ptr = out.data_ptr<T>();
  const int64_t* table = block_table.data_ptr<int64_t>();
  const int64_t* starts = query_start.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> key(head_dim), acc, scores, query;
    for (int64_t work = begin; work < end; ++work) {
      const int64_t s = work / num_kv_heads, h = work % num_kv_heads;
      const int64_t q0 = starts[s], num_q = starts[s + 1] - q0, ctx = lens[s];
      const int64_t rows = num_q * group;  // query rows of this kv head: (query, head in group)
      const int64_t first_key = sliding_window > 0 ? std::max<int64_t>(0, ctx - num_q + 1 - sliding_window) : 0;
      query.assign(rows * head_dim, 0.f);
      for (int64_t i = 0; i < num_q; ++i)
        for (int64_t g = 0; g < group; ++g) {
          const T* src = q_ptr + ((q0 + i) * num_heads + h * group + g) * head_dim;
          float* dst = query.data() + (i * group + g) * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<float>(src[d]) * fscale;
        }
      const int64_t num_keys = ctx - first_key;
      scores.assign(rows * num_keys, -INFINITY);
      for (int64_t j = first_key; j < ctx; ++j) {
        const int64_t slot = table[s * table_width + j / block_size] * block_size + j % block_size;
        const T* k = k_ptr + (slot * num_kv_heads + h) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) key[d] = static_cast<float>(k[d]);
        for (int64_t i = 0; i < num_q; ++i) {
          const int64_t pos = ctx - num_q + i;  // causal and window limits of query i
          if (j > pos || (sliding_window > 0 && j <= pos - sliding_window)) continue;
          for (int64_t g = 0; g < group; ++g) {
            const float* qr = query.data() + (i * group + g) * head_dim;
            float dot = 0.f;
            for (int64_t d = 0; d < head_dim; ++d) dot += qr[d] * key[d];
            scores[(i * group + g) * num_keys + (j - first_key)] = dot;
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {  // softmax of each row, in place
        float* row = scores.data() + r * num_keys;
        const float top = *std::max_element(row, row + num_keys);
        float total = 0.f;
        for (int64_t j = 0; j < num_keys; ++j) total += (row[j] = std::exp(row[j] - top));
        for (int64_t j = 0; j < num_keys; ++j) row[j] /= total;
      }
      acc.assign(rows * head_dim, 0.f);
      for (int64_t j = first_key; j < ctx; ++j) {
        const int64_t slot = table[s * table_width + j / block_size] * block_size + j % block_size;
        const T* v = v_ptr + (slot * num_kv_heads + h) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) key[d] = static_cast<float>(v[d]);
        for (int64_t r = 0; r < rows; ++r) {
          const float p = scores[r * num_keys + (j - first_key)];
          if (p == 0.f) continue;
          float* a = acc.data() + r * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) a[d] += p * key[d];
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = r / group, g = r % group;
        T* dst = out_ptr + ((q0 + i) * num_heads + h * group + g) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<T>(acc[r * head_dim + d]);
      }
    }
  });
}

at::Tensor paged_attention_cpu(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_table,
                               const at::Tensor& query_start, const at::Tensor& context_lens, int64_t block_size,
                               double scale, int64_t sliding_window) {
  TORCH_CHECK(q.is_contiguous() && kv_cache.is_contiguous(), "q and kv_cache must be contiguous");
  TORCH_CHECK(q.scalar_type() == kv_cache.scalar_type(), "q and kv_cache must share a dtype");
  auto table = block_table.contiguous(), starts = query_start.contiguous(), lens = context_lens.contiguous();
  at::Tensor out = at::empty_like(q);
  if (q.scalar_type() == at::kBFloat16) {
    run<c10::BFloat16>(q, kv_cache, table, starts, lens, block_size, scale, sliding_window, out);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "paged_attention_cpu takes bfloat16 or float32");
    run<float>(q, kv_cache, table, starts, lens, block_size, scale, sliding_window, out);
  }
  return out;
}

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
    for (int64_t r = begin; r < end; ++r) {
      const float* row = src + r * dim;
      float sum = 0.f;
      for (int64_t d = 0; d < dim; ++d) sum += row[d] * row[d];
      const float scale = 1.f / std::sqrt(sum / static_cast<float>(dim) + static_cast<float>(eps));
      for (int64_t d = 0; d < dim; ++d) dst[r * dim + d] = row[d] * scale * w[d];
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(draftwise_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor kv_cache, Tensor block_table, Tensor query_start, "
        "Tensor context_lens, int block_size, float scale, int sliding_window) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, &paged_attention_cpu);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.impl("rms_norm", c10::DispatchKey::CPU, &rms_norm_cpu);
}
