// Activations as gguf_linear's integer dots read them: each row quantized to 8 bits per unit of 32
// values (d = max|x| / 127, q = round(x / d), as llama.cpp's Q8_0), kGroup units to an ActGroup.
#pragma once

#include "gguf_blocks.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace draftwise_gguf {

// kGroup units of one activation row. `q` holds the units in slot order (kSlot). Lane k of `d` /
// `ds` belongs to half k / kGroup (values 0-15 or 16-31) of unit k % kGroup: d = the unit's scale,
// ds = d * sum(q) over the half.
struct alignas(64) ActGroup {
  int8_t q[kGroup][kUnit];
  float d[2 * kGroup];
  float ds[2 * kGroup];
};

// Rows [num_rows, in_features] to num_rows * num_groups groups; units past a row's end are zero.
template <typename In>  // float or c10::BFloat16
void quantize_rows(const In* x, int64_t num_rows, int64_t in_features, int64_t num_groups, ActGroup* out) {
  std::memset(static_cast<void*>(out), 0, sizeof(ActGroup) * num_rows * num_groups);
  const int64_t num_units = in_features / kUnit;
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t u = 0; u < num_units; ++u) {
      float src[kUnit];
      for (int64_t i = 0; i < kUnit; ++i) src[i] = static_cast<float>(x[r * in_features + u * kUnit + i]);
      ActGroup& g = out[r * num_groups + u / kGroup];
      const int64_t j = u % kGroup;
      float amax = 0.f;
      for (int64_t i = 0; i < kUnit; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t sum[2] = {0, 0};
      int8_t* q = g.q[kSlot[j]];
      for (int64_t i = 0; i < kUnit; ++i) {
        q[i] = static_cast<int8_t>(std::nearbyint(src[i] * inv));
        sum[i / 16] += q[i];
      }
      for (int h = 0; h < 2; ++h) g.d[h * kGroup + j] = d, g.ds[h * kGroup + j] = d * static_cast<float>(sum[h]);
    }
}

}  // namespace draftwise_gguf
