// The C++ entry point of paged_attention.cpp, for other kernels of this library
// (stack/decoder_stack.cpp): the draftwise_cpu::paged_attention op without the dispatcher.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace draftwise_cpu_kernels {

// q [num_tokens, num_heads, head_dim] and kv_cache [2, num_slots, num_kv_heads, head_dim] of one
// dtype (bf16 or fp32); block_table [num_seqs, width], query_start [num_seqs + 1] and
// context_lens [num_seqs] int64; tree_mask, if given, [num_tokens, 2] int64 (tree_start, bits) per row
// (paged_attention.cpp's header states what a row then sees). Returns [num_tokens, num_heads, head_dim] in
// q's dtype.
at::Tensor paged_attention_cpu(const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_table,
                               const at::Tensor& query_start, const at::Tensor& context_lens, int64_t block_size,
                               double scale, int64_t sliding_window, const std::optional<at::Tensor>& tree_mask);

}  // namespace draftwise_cpu_kernels
