// CPU-only build: the Qwen3-Next kernels say "not built with CUDA"; the
// state size is plain arithmetic and answers everywhere.
#include "configs/error.h"
#include "gpu/deltanet.h"

namespace hmoe::gpu {
namespace {
[[noreturn]] void no_cuda(const char* what) { fail(ErrorKind::unsupported, std::string("gpu::") + what + ": not built with CUDA"); }
}  // namespace

int64_t deltanet_layer_state_bytes(const DeltaNetShape& sh) {
  const int64_t floats = (sh.conv_k - 1) * sh.conv_dim() + sh.nv * sh.dk * sh.dv;
  return (floats * 4 + 255) / 256 * 256;
}
void deltanet_configure(const DeltaNetShape&) { no_cuda("deltanet_configure"); }
void deltanet_prepare(const float*, int64_t, const DeltaNetGroups&, int64_t, int64_t, const DeltaNetShape&, const float*, const float*, const float*,
                      int64_t, float*, float*, float*, Stream&) {
  no_cuda("deltanet_prepare");
}
void deltanet_conv_window(const float*, int64_t, const DeltaNetGroups&, int64_t, int64_t, const DeltaNetShape&, int64_t, Stream&) {
  no_cuda("deltanet_conv_window");
}
void deltanet_chunked(const float*, const float*, const float*, const DeltaNetGroups&, int64_t, int64_t, const DeltaNetShape&, int64_t, int64_t,
                      int64_t, float*, Stream&) {
  no_cuda("deltanet_chunked");
}
void deltanet_chunked(const float*, const float*, const float*, const DeltaNetGroups&, int64_t, int64_t, const DeltaNetShape&, int64_t, int64_t,
                      int64_t, float*, Stream&, DeltaNetKernel, int64_t, void*) {
  no_cuda("deltanet_chunked");
}
namespace {
DeltaNetKernel chosen_kernel = DeltaNetKernel::v1;
}
void set_deltanet_kernel(DeltaNetKernel k) { chosen_kernel = k; }
DeltaNetKernel deltanet_kernel() { return chosen_kernel; }
namespace {
DeltaNetIo chosen_io = DeltaNetIo::automatic;
}
void set_deltanet_io(DeltaNetIo io, int64_t) { chosen_io = io; }
DeltaNetIo deltanet_io() { return chosen_io; }
int64_t deltanet_v2_chunk(const DeltaNetShape&, int64_t) { no_cuda("deltanet_v2_chunk"); }
int64_t deltanet_v2_slots(int64_t ntok, int64_t gn, int64_t v2_chunk) { return v2_chunk > 0 ? ntok / v2_chunk + gn : 0; }
int64_t deltanet_v2_scratch_bytes(const DeltaNetShape& sh, int64_t v2_chunk, int64_t slots) {
  return v2_chunk > 0 ? slots * sh.nv * (v2_chunk * sh.dk + v2_chunk * v2_chunk + 2 * v2_chunk + 8) * 4 : 0;
}
int64_t deltanet_v3_chunk(const DeltaNetShape&, int64_t) { no_cuda("deltanet_v3_chunk"); }
void set_deltanet_v3_phases(int) {}
int64_t deltanet_v3_scratch_bytes(const DeltaNetShape& sh, int64_t c, int64_t slots) {
  return c > 0 ? slots * sh.nv * (2 * c * sh.dk + c * c + 2 * c + 8 + sh.dk * sh.dv) * 4 : 0;
}
int64_t deltanet_v4_chunk(const DeltaNetShape&, int64_t) { no_cuda("deltanet_v4_chunk"); }
void set_deltanet_v4_phases(int) {}
void set_deltanet_v4_walk(int) {}
int deltanet_v4_walk() { return 1; }
int64_t deltanet_v4_scratch_bytes(const DeltaNetShape& sh, int64_t c, int64_t slots) { return c > 0 ? slots * sh.nv * (2 * c * c + 2 * c + 8) * 4 : 0; }
int64_t deltanet_v5_chunk(const DeltaNetShape&, int64_t) { no_cuda("deltanet_v5_chunk"); }
void set_deltanet_v5_phases(int) {}
int64_t deltanet_v5_scratch_bytes(const DeltaNetShape& sh, int64_t c, int64_t slots) {
  return c > 0 ? slots * sh.nv * (2 * c * c + 2 * c + 8 + c * sh.dk + sh.dk * sh.dv) * 4 : 0;
}
int64_t deltanet_chunked_scratch_bytes(const DeltaNetShape&, DeltaNetKernel kernel, int64_t, int64_t, int64_t) {
  if (kernel == DeltaNetKernel::v1) return 0;
  no_cuda("deltanet_chunked_scratch_bytes");
}
void deltanet_recurrent(const float*, const float*, const float*, const DeltaNetGroups&, int64_t, int64_t, const DeltaNetShape&, int64_t, int64_t,
                        float*, Stream&) {
  no_cuda("deltanet_recurrent");
}
void deltanet_gated_norm(const float*, const float*, int64_t, const DeltaNetGroups&, int64_t, int64_t, const DeltaNetShape&, const float*, float,
                         uint16_t*, Stream&, uint16_t*, int64_t) {
  no_cuda("deltanet_gated_norm");
}
void gated_qkv_prepare(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, const float*, float, const int32_t*,
                       const float*, const int32_t*, uint16_t*, uint16_t*, float*, Stream&) {
  no_cuda("gated_qkv_prepare");
}
void gated_attention_gate(uint16_t*, const float*, int64_t, int64_t, int64_t, int64_t, Stream&, uint16_t*, uint16_t*) { no_cuda("gated_attention_gate"); }
void add_sigmoid_scaled(float*, const float*, const float*, int64_t, int64_t, Stream&) { no_cuda("add_sigmoid_scaled"); }

}  // namespace hmoe::gpu
