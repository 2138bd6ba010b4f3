// draftwise_cpu::uniform_noise: the sampler's counter-based uniforms (sample/logits.py), bit for bit.
//
// out[r, c] = ((bits >> 9) + 0.5) / 2^23 with bits a lowbias32 hash of (seed r, position r, column c,
// stream); the Python reference computes the same 32-bit arithmetic on int64 tensors (low 32 bits
// of every sum and product), so both paths give identical values. One pass, rows split over threads.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

namespace {

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

at::Tensor uniform_noise(const at::Tensor& seeds, const at::Tensor& positions, int64_t num_cols, int64_t stream) {
  TORCH_CHECK(seeds.dim() == 1 && positions.sizes() == seeds.sizes(), "seeds and positions: [num_rows] each");
  const auto s = seeds.to(at::kLong).contiguous();
  const auto p = positions.to(at::kLong).contiguous();
  const int64_t rows = s.size(0);
  auto out = at::empty({rows, num_cols}, s.options().dtype(at::kFloat));
  const int64_t* sp = s.data_ptr<int64_t>();
  const int64_t* pp = p.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const uint32_t stream_term = static_cast<uint32_t>(stream) * 0x85EBCA6Bu;
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint64_t seed = static_cast<uint64_t>(sp[r]);
      uint32_t key = mix32(static_cast<uint32_t>(seed) ^ mix32(static_cast<uint32_t>(seed >> 32)));
      key = mix32(key + static_cast<uint32_t>(pp[r]) * 0x9E3779B9u + stream_term);
      float* row = op + r * num_cols;
      for (int64_t c = 0; c < num_cols; ++c) {
        const uint32_t bits = mix32(mix32(key ^ (static_cast<uint32_t>(c) * 0xC2B2AE35u)));
        row[c] = (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftwise_cpu, m) {
  m.def("uniform_noise(Tensor seeds, Tensor positions, int num_cols, int stream) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftwise_cpu, CPU, m) { m.impl("uniform_noise", uniform_noise); }
