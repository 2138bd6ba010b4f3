// The draftwise_cpu operator library. Each op registers itself from the file of its concern, as a
// fragment of this library:
//   attention/  paged_attention, the paged cache's attention for every CPU row
//   gguf/       gguf_linear, gguf_repack: linears on GGUF blocks as stored or repacked once at load
//   linear/     packed_linear: a PackedLinear's oneDNN kernel as one op
//   norm/       rms_norm
//   sampling/   uniform_noise, the sampler's counter-based noise
//   stack/      DecoderStack, a decoder's layers on GGUF blocks as one call
// Every source is built with -march=native on the machine that runs it (kernels/native.py).
#include <torch/library.h>

TORCH_LIBRARY(draftwise_cpu, m) {}
