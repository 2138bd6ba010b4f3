// draftwise_cpu.DecoderStack: a decoder's layers on GGUF blocks, run from C++ with no Python between ops.
//
// A stack holds, per layer, the fp32 norm weights and the four projections (qkv, o, gate_up, down),
// each one or more GGUF weights side by side (gguf_linear.h), and runs the layer as the Python
// DecoderLayer does: pre-norm, qkv (+ bias), per-head q/k norms where the model has them, neox
// rotary embedding, attention, o_proj, optional sandwich norm, residual; pre-MLP norm, gate_up,
// act(gate) * up, down, optional sandwich norm, residual. Everything between the linears is fp32;
// q, k and v are rounded to the KV cache's dtype (bf16 or fp32) once, where they enter attention.
//
// Three entry points, with identical arithmetic for a row whatever the path:
//   forward(x, ...)           layers [first, end) with the paged attention kernel (paged_attention.h)
//                             and the K/V written to the cache here: a decode or verify step, its rows
//                             optionally under a token-tree mask (tree_mask, as the kernel takes it);
//   pre_attention(i, x, ...)  layer i up to attention: q, k, v in the cache dtype;
//   post_attention(i, x, a)   layer i from its attention output on;
// the two halves let the caller attend with any kernel (a step mixing prefill chunks and decodes).
// Rows are independent: a row's result does not depend on the other rows of the call.
#include "gguf/gguf_linear.h"
#include "attention/paged_attention.h"
#include "norm/rms_norm.h"

#include <ATen/Functions.h>
#include <c10/util/BFloat16.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

namespace {

// Rows whose projections and MLP activations exist at once (a row's result does not depend on it;
// POST_ATTENTION_ROWS in decoder_stack.py).
constexpr int64_t kRowChunk = 512;

// One GGUF weight of a projection: its blocks, type id, layout and its columns of the output.
struct Part {
  at::Tensor blocks;  // [out_features, row_bytes] uint8
  int64_t qtype;
  bool packed;
  int64_t out_features, first_column;
};

// A projection: its parts side by side, plus an optional fp32 bias over all their columns.
struct Proj {
  std::vector<Part> parts;
  at::Tensor bias;  // [out_features] fp32, or undefined
  int64_t in_features = 0, out_features = 0;

  void operator()(const float* x, int64_t rows, float* y) const {  // x [rows, in], y [rows, out]
    const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
    for (const Part& p : parts)
      draftwise_gguf::linear_f32(x, rows, in_features, p.blocks.data_ptr<uint8_t>(), p.out_features, p.qtype,
                                 p.packed, b ? b + p.first_column : nullptr, y + p.first_column, out_features);
  }
};

struct Layer {
  at::Tensor input_norm, pre_mlp_norm, post_attn_norm, post_mlp_norm, q_norm, k_norm;  // fp32; undefined: none
  Proj qkv, o, gate_up, down;
  double scale;
  bool sliding;
  int64_t rope;  // which of the rope tables the layer uses
};

// RMSNorm over rows of `dim` (in place when out == x), as the draftwise_cpu::rms_norm op computes it.
void rms_norm(const float* x, int64_t rows, int64_t dim, const at::Tensor& weight, double eps, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    draftwise_cpu_kernels::rms_norm_row(x + r * dim, dim, weight.data_ptr<float>(), static_cast<float>(eps),
                                        out + r * dim);
}

// Neox rotary embedding of `heads` heads of each row, in place; sin carries rotate_half's sign.
void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t dim, const float* cos,
          const float* sin) {
  const int64_t half = dim / 2;
  std::vector<float> head(dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + r * row_stride + h * dim;
      std::memcpy(head.data(), v, dim * sizeof(float));
      const float* c = cos + r * dim;
      const float* s = sin + r * dim;
      for (int64_t d = 0; d < dim; ++d) v[d] = head[d] * c[d] + head[d < half ? d + half : d - half] * s[d];
    }
}

template <typename T>
void store(const float* src, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}

template <typename T>
void load(const T* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

at::Tensor fp32_rows(const at::Tensor& t, int64_t dim) {  // [rows, dim] contiguous fp32
  return t.to(at::kFloat).contiguous().view({-1, dim});
}

struct DecoderStack : torch::CustomClassHolder {
  int64_t hidden, num_heads, num_kv_heads, head_dim, act;  // act: 0 silu, 1 gelu (tanh approximation)
  double eps;
  std::vector<Layer> layers;

  DecoderStack(int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, int64_t act)
      : hidden(hidden), num_heads(num_heads), num_kv_heads(num_kv_heads), head_dim(head_dim), act(act), eps(eps) {
    TORCH_CHECK(act == 0 || act == 1, "DecoderStack: act must be 0 (silu) or 1 (gelu_tanh), got ", act);
  }

  // norms: input, pre_mlp, post_attn, post_mlp, q, k (empty tensors where the model has none);
  // blocks / qtypes / packed (0 or 1): every part of qkv, o, gate_up, down in that order, num_parts[4] of
  // them per projection; biases: one per projection (empty: none).
  void add_layer(std::vector<at::Tensor> norms, std::vector<at::Tensor> blocks, std::vector<int64_t> qtypes,
                 std::vector<int64_t> packed, std::vector<int64_t> num_parts, std::vector<at::Tensor> biases,
                 double scale, bool sliding, int64_t rope_index) {
    TORCH_CHECK(norms.size() == 6 && num_parts.size() == 4 && biases.size() == 4, "DecoderStack: bad layer");
    Layer layer;
    at::Tensor* slots[6] = {&layer.input_norm, &layer.pre_mlp_norm, &layer.post_attn_norm, &layer.post_mlp_norm,
                            &layer.q_norm, &layer.k_norm};
    for (int i = 0; i < 6; ++i)
      if (norms[i].numel() > 0) *slots[i] = norms[i].to(at::kFloat).contiguous();
    const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    Proj* projs[4] = {&layer.qkv, &layer.o, &layer.gate_up, &layer.down};
    size_t next = 0;
    for (int p = 0; p < 4; ++p) {
      Proj& proj = *projs[p];
      for (int64_t j = 0; j < num_parts[p]; ++j, ++next) {
        TORCH_CHECK(next < blocks.size() && next < qtypes.size() && next < packed.size(), "DecoderStack: parts");
        const at::Tensor& b = blocks[next];
        proj.parts.push_back({b.contiguous(), qtypes[next], packed[next] != 0, b.size(0), proj.out_features});
        proj.out_features += b.size(0);
      }
      TORCH_CHECK(!proj.parts.empty(), "DecoderStack: a projection without weights");
      if (biases[p].numel() > 0) proj.bias = biases[p].to(at::kFloat).contiguous();
    }
    const int64_t in_features[4] = {hidden, q_size, hidden, layer.gate_up.out_features / 2};
    for (int p = 0; p < 4; ++p) {
      Proj& proj = *projs[p];
      proj.in_features = in_features[p];
      for (const Part& part : proj.parts)
        draftwise_gguf::check_weight(part.qtype, part.packed, proj.in_features, part.blocks.size(1));
    }
    TORCH_CHECK(layer.qkv.out_features == q_size + 2 * kv_size && layer.o.out_features == hidden &&
                    layer.down.out_features == hidden,
                "DecoderStack: projection sizes do not match the heads and hidden size");
    layer.scale = scale, layer.sliding = sliding, layer.rope = rope_index;
    layers.push_back(std::move(layer));
  }

  // Layer i up to attention over fp32 rows x: q, k, v [rows, q_size + 2 kv_size] fp32 in `qkv`.
  void qkv_rows(const Layer& l, const float* x, int64_t rows, const float* cos, const float* sin, float* qkv) const {
    std::vector<float> h(rows * hidden);
    rms_norm(x, rows, hidden, l.input_norm, eps, h.data());
    l.qkv(h.data(), rows, qkv);
    const int64_t width = l.qkv.out_features, q_size = num_heads * head_dim;
    if (l.q_norm.defined()) {
      for (int64_t r = 0; r < rows; ++r) {
        rms_norm(qkv + r * width, num_heads, head_dim, l.q_norm, eps, qkv + r * width);
        rms_norm(qkv + r * width + q_size, num_kv_heads, head_dim, l.k_norm, eps, qkv + r * width + q_size);
      }
    }
    rope(qkv, rows, num_heads + num_kv_heads, width, head_dim, cos, sin);  // q and k heads are adjacent
  }

  // x += the rest of layer i given its attention output attn [rows, q_size] fp32.
  void finish_rows(const Layer& l, float* x, int64_t rows, const float* attn) const {
    std::vector<float> h(rows * hidden), norm(rows * hidden);
    l.o(attn, rows, h.data());
    if (l.post_attn_norm.defined()) rms_norm(h.data(), rows, hidden, l.post_attn_norm, eps, h.data());
    for (int64_t i = 0; i < rows * hidden; ++i) x[i] += h[i];
    rms_norm(x, rows, hidden, l.pre_mlp_norm, eps, norm.data());
    const int64_t inter = l.down.in_features;
    std::vector<float> gate_up(rows * 2 * inter), mid(rows * inter);
    l.gate_up(norm.data(), rows, gate_up.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < inter; ++j) {
        const float g = gate_up[r * 2 * inter + j], u = gate_up[r * 2 * inter + inter + j];
        const float a = act == 0 ? g / (1.f + std::exp(-g))
                                 : 0.5f * g * (1.f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g)));
        mid[r * inter + j] = a * u;
      }
    l.down(mid.data(), rows, h.data());
    if (l.post_mlp_norm.defined()) rms_norm(h.data(), rows, hidden, l.post_mlp_norm, eps, h.data());
    for (int64_t i = 0; i < rows * hidden; ++i) x[i] += h[i];
  }

  std::tuple<at::Tensor, at::Tensor, at::Tensor> pre_attention(int64_t i, at::Tensor x, at::Tensor cos,
                                                               at::Tensor sin, bool bf16) {
    const Layer& l = layers.at(i);
    const at::Tensor input = fp32_rows(x, hidden);
    const int64_t rows = input.size(0), q_size = num_heads * head_dim;
    at::Tensor qkv = at::empty({rows, l.qkv.out_features}, input.options());
    qkv_rows(l, input.data_ptr<float>(), rows, fp32_rows(cos, head_dim).data_ptr<float>(),
             fp32_rows(sin, head_dim).data_ptr<float>(), qkv.data_ptr<float>());
    at::Tensor cast = bf16 ? qkv.to(at::kBFloat16) : qkv;
    auto split = cast.split_with_sizes({q_size, num_kv_heads * head_dim, num_kv_heads * head_dim}, 1);
    return {split[0].reshape({rows, num_heads, head_dim}), split[1].reshape({rows, num_kv_heads, head_dim}),
            split[2].reshape({rows, num_kv_heads, head_dim})};
  }

  at::Tensor post_attention(int64_t i, at::Tensor x, at::Tensor attn) {
    at::Tensor out = fp32_rows(x, hidden).clone();
    const at::Tensor a = fp32_rows(attn, num_heads * head_dim);
    finish_rows(layers.at(i), out.data_ptr<float>(), out.size(0), a.data_ptr<float>());
    return out;
  }

  at::Tensor forward(at::Tensor x, std::vector<at::Tensor> cos, std::vector<at::Tensor> sin, at::Tensor kv_caches,
                     at::Tensor slot_mapping, at::Tensor block_table, at::Tensor query_start,
                     at::Tensor context_lens, int64_t block_size, int64_t sliding_window, int64_t first,
                     int64_t end, std::optional<at::Tensor> tree_mask) {
    TORCH_CHECK(0 <= first && first <= end && end <= static_cast<int64_t>(layers.size()), "DecoderStack: layers");
    at::Tensor out = fp32_rows(x, hidden).clone();
    const int64_t rows = out.size(0), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    TORCH_CHECK(slot_mapping.numel() == rows, "DecoderStack: one cache slot per row");
    std::vector<at::Tensor> cos32, sin32;
    for (size_t t = 0; t < cos.size(); ++t) {
      cos32.push_back(fp32_rows(cos[t], head_dim));
      sin32.push_back(fp32_rows(sin[t], head_dim));
    }
    const bool bf16 = kv_caches.scalar_type() == at::kBFloat16;
    TORCH_CHECK(bf16 || kv_caches.scalar_type() == at::kFloat, "DecoderStack: the KV cache must be bf16 or fp32");
    const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
    const int64_t* slot = slots.data_ptr<int64_t>();
    const int64_t width = q_size + 2 * kv_size;
    std::vector<float> qkv(rows * width), attn(rows * q_size);
    at::Tensor q = at::empty({rows, num_heads, head_dim}, kv_caches.options());
    for (int64_t i = first; i < end; ++i) {
      const Layer& l = layers[i];
      const float* cos_rows = cos32.at(l.rope).data_ptr<float>();
      const float* sin_rows = sin32.at(l.rope).data_ptr<float>();
      for (int64_t r = 0; r < rows; r += kRowChunk)
        qkv_rows(l, out.data_ptr<float>() + r * hidden, std::min(kRowChunk, rows - r), cos_rows + r * head_dim,
                 sin_rows + r * head_dim, qkv.data() + r * width);
      at::Tensor cache = kv_caches.select(0, i);  // [2, num_slots, num_kv_heads, head_dim]
      const int64_t num_slots = cache.size(1);
      for (int64_t r = 0; r < rows; ++r) {
        const float* src = qkv.data() + r * width;
        if (bf16) {
          auto* k = cache.data_ptr<c10::BFloat16>();
          store(src, q_size, q.data_ptr<c10::BFloat16>() + r * q_size);
          store(src + q_size, kv_size, k + slot[r] * kv_size);
          store(src + q_size + kv_size, kv_size, k + (num_slots + slot[r]) * kv_size);
        } else {
          auto* k = cache.data_ptr<float>();
          std::memcpy(q.data_ptr<float>() + r * q_size, src, q_size * sizeof(float));
          std::memcpy(k + slot[r] * kv_size, src + q_size, kv_size * sizeof(float));
          std::memcpy(k + (num_slots + slot[r]) * kv_size, src + q_size + kv_size, kv_size * sizeof(float));
        }
      }
      const at::Tensor a = draftwise_cpu_kernels::paged_attention_cpu(
          q, cache, block_table, query_start, context_lens, block_size, l.scale, l.sliding ? sliding_window : 0,
          tree_mask);
      if (bf16) {
        load(a.data_ptr<c10::BFloat16>(), rows * q_size, attn.data());
      } else {
        std::memcpy(attn.data(), a.data_ptr<float>(), rows * q_size * sizeof(float));
      }
      for (int64_t r = 0; r < rows; r += kRowChunk)
        finish_rows(l, out.data_ptr<float>() + r * hidden, std::min(kRowChunk, rows - r), attn.data() + r * q_size);
    }
    return out;
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftwise_cpu, m) {
  m.class_<DecoderStack>("DecoderStack")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, double, int64_t>())
      .def("add_layer", &DecoderStack::add_layer)
      .def("pre_attention", &DecoderStack::pre_attention)
      .def("post_attention", &DecoderStack::post_attention)
      .def("forward", &DecoderStack::forward, "",
           {torch::arg("x"), torch::arg("cos"), torch::arg("sin"), torch::arg("kv_caches"), torch::arg("slot_mapping"),
            torch::arg("block_table"), torch::arg("query_start"), torch::arg("context_lens"), torch::arg("block_size"),
            torch::arg("sliding_window"), torch::arg("first"), torch::arg("end"),
            torch::arg("tree_mask") = torch::arg::none()})
      .def("num_layers", &DecoderStack::num_layers);
}
