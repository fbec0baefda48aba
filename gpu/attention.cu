// Causal GQA attention over the paged KV cache (bf16 K/V, fp32 math).
// Version 1: one block of 128 threads per (token, head); keys in chunks of
// 128, one warp per key for the scores, one thread per output dimension for
// the weighted V sum, online softmax across chunks.
// Version 2: as 1, plus split-K (flash-decoding) when few (token, head)
// blocks face long contexts: each of S blocks takes a slice of the keys and
// writes (max, sum, acc); a second kernel combines the slices.
// Version 3 (this): head_dim up to 256 (Qwen3-Next's full attention). The
// block size is a template bound HD (128 or 256 threads, one thread per
// output dimension); head_dim <= 128 runs the 128-thread instantiation,
// which is version 2's code unchanged, so its speed is too.
#include <algorithm>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/decode_fused.h"
#include "gpu/kernels.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kChunk = 128;  // keys per chunk of the online softmax

// FUSED (decode, one token per sequence): q/k RMSNorm + rotary of the raw
// q|k|v row and the KV store (qkv_norm_rope_store's arithmetic) in the same
// launch. The token's own key and value (its last position) come from
// shared memory, rounded to bf16 as the cache holds them, because the
// block of the group's first head stores them concurrently.
struct FusedRope {
  const uint16_t *wq, *wk;
  float eps;
  const int32_t *pos, *slots;
  const float* inv_freq;
  uint16_t *kc_out, *vc_out;
};

// Normalises the head of `hd` floats at src with weight w and rotates it at
// position p, into dst (hd floats of shared memory). Every thread of the block calls it.
__device__ __forceinline__ void norm_rope_head(const float* src, int hd, const uint16_t* w, float eps, float p, const float* inv_freq, float* tmp,
                                               float* dst) {
  const int i = threadIdx.x;
  const float a = i < hd ? src[i] : 0.0f;
  const float ss = block_sum(a * a);
  const float inv = rsqrtf(ss / static_cast<float>(hd) + eps);
  if (i < hd) tmp[i] = bf2f(w[i]) * (a * inv);
  __syncthreads();
  const int half = hd / 2;
  if (i < half) {
    const float f = p * inv_freq[i];
    const float c = static_cast<float>(cos(static_cast<double>(f))), sn = static_cast<float>(sin(static_cast<double>(f)));
    const float x0 = tmp[i], x1 = tmp[i + half];
    dst[i] = x0 * c - x1 * sn;
    dst[i + half] = x1 * c + x0 * sn;
  }
  __syncthreads();
}

// splits == 1: writes out; else writes scratch[((t*heads + h)*splits + z)*(hd + 2)] = {m, l, acc[hd]}.
// HD threads (HD >= hd): HD / 32 warps score keys, thread d < hd owns output dimension d.
template <bool FUSED, int HD>
__global__ void attention_kernel(const float* q, int64_t ldq, int heads, int kv_heads, int hd, const uint16_t* kc, const uint16_t* vc,
                                 const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, int splits,
                                 float* scratch, uint16_t* out, FusedRope fr) {
  constexpr int kThreads = HD;
  __shared__ float qs[HD];
  __shared__ float sc[kChunk];
  __shared__ float ks[HD], vs[HD], tmp[HD];
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x, h = blockIdx.y, z = blockIdx.z, g = h / (heads / kv_heads);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* qrow = q + static_cast<int64_t>(t) * ldq;
  if (FUSED) {
    const float p = static_cast<float>(fr.pos[t]);
    norm_rope_head(qrow + h * hd, hd, fr.wq, fr.eps, p, fr.inv_freq, tmp, qs);
    norm_rope_head(qrow + (heads + g) * hd, hd, fr.wk, fr.eps, p, fr.inv_freq, tmp, ks);
    if (tid < hd) {
      const uint16_t kb = f2bf(ks[tid]), vb = f2bf(qrow[(heads + kv_heads + g) * hd + tid]);
      ks[tid] = bf2f(kb);
      vs[tid] = bf2f(vb);
      if (h % (heads / kv_heads) == 0 && z == 0) {  // the group's first head stores the token's key and value
        const int64_t at = static_cast<int64_t>(fr.slots[t]) * kv_heads * hd + g * hd + tid;
        fr.kc_out[at] = kb;
        fr.vc_out[at] = vb;
      }
    }
  } else if (tid < hd) {
    qs[tid] = qrow[h * hd + tid];
  }
  __syncthreads();
  const int len = lens[t];
  const int per = (len + splits - 1) / splits;
  const int beg = min(len, z * per), end = min(len, beg + per);
  const int32_t* sl = slot_lists + offsets[t];
  const int64_t row = static_cast<int64_t>(kv_heads) * hd;
  float m = -INFINITY, l = 0, acc = 0;
  for (int base = beg; base < end; base += kChunk) {
    const int cn = min(kChunk, end - base);
    for (int j = warp; j < cn; j += kThreads / 32) {
      const uint16_t* kp = kc + static_cast<int64_t>(sl[base + j]) * row + g * hd;
      float s = 0;
      if (FUSED && base + j == len - 1)
        for (int d = lane; d < hd; d += 32) s += qs[d] * ks[d];
      else
        for (int d = lane; d < hd; d += 32) s += qs[d] * bf2f(kp[d]);
      s = warp_sum(s);
      if (lane == 0) sc[j] = s * scale;
    }
    __syncthreads();
    float cmax = -INFINITY;
    for (int j = 0; j < cn; ++j) cmax = fmaxf(cmax, sc[j]);
    const float nm = fmaxf(m, cmax), corr = expf(m - nm);
    float psum = 0, part = 0;
    for (int j = 0; j < cn; ++j) {
      const float p = expf(sc[j] - nm);
      psum += p;
      if (tid < hd) part += p * (FUSED && base + j == len - 1 ? vs[tid] : bf2f(vc[static_cast<int64_t>(sl[base + j]) * row + g * hd + tid]));
    }
    l = l * corr + psum;
    acc = acc * corr + part;
    m = nm;
    __syncthreads();
  }
  if (splits == 1) {
    if (tid < hd) out[(static_cast<int64_t>(t) * heads + h) * hd + tid] = f2bf(len > 0 ? acc / l : 0.0f);
    return;
  }
  float* dst = scratch + ((static_cast<int64_t>(t) * heads + h) * splits + z) * (hd + 2);
  if (tid == 0) {
    dst[0] = m;
    dst[1] = l;
  }
  if (tid < hd) dst[2 + tid] = acc;
}

// One block of hd threads per (token, head).
__global__ void attention_combine_kernel(int heads, int hd, int splits, const float* scratch, uint16_t* out) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const float* src = scratch + (static_cast<int64_t>(t) * heads + h) * splits * (hd + 2);
  float mx = -INFINITY;
  for (int z = 0; z < splits; ++z) mx = fmaxf(mx, src[z * (hd + 2)]);
  float l = 0, acc = 0;
  for (int z = 0; z < splits; ++z) {
    const float* p = src + z * (hd + 2);
    if (p[1] == 0) continue;  // an empty slice
    const float w = expf(p[0] - mx);
    l += w * p[1];
    acc += w * p[2 + d];
  }
  out[(static_cast<int64_t>(t) * heads + h) * hd + d] = f2bf(l > 0 ? acc / l : 0.0f);
}

}  // namespace

int64_t attention_splits(int64_t n, int64_t heads, int64_t max_len) {
  if (n * heads >= 512 || max_len <= 512) return 1;
  return std::min<int64_t>(32, (max_len + 255) / 256);
}

int64_t attention_scratch_floats(int64_t n, int64_t heads, int64_t hd, int64_t max_len) {
  const int64_t s = attention_splits(n, heads, max_len);
  return s == 1 ? 0 : n * heads * s * (hd + 2);
}

namespace {

template <bool FUSED, int HD>
void attention_launch_hd(const float* q, int64_t ldq, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* kc, const bf16_t* vc,
                         const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, int64_t max_len, float scale, float* scratch,
                         bf16_t* out, const FusedRope& fr, Stream& s) {
  const int64_t splits = attention_splits(n, heads, max_len);
  if (splits > 1 && scratch == nullptr) fail(ErrorKind::internal, "gpu::attention: split-K needs scratch");
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(heads), static_cast<unsigned>(splits));
  launch_pdl(s, attention_kernel<FUSED, HD>, grid, dim3(HD), 0, q, ldq, static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(hd), kc,
             vc, slot_lists, offsets, lens, scale, static_cast<int>(splits), scratch, out, fr);
  if (splits > 1) {
    launch_pdl(s, attention_combine_kernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), dim3(static_cast<unsigned>(hd)), 0,
               static_cast<int>(heads), static_cast<int>(hd), static_cast<int>(splits), scratch, out);
  }
}

// The 128-thread kernel for head_dim <= 128 (Qwen3-MoE's decode step), the 256-thread one above.
template <bool FUSED>
void attention_launch(const float* q, int64_t ldq, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* kc, const bf16_t* vc,
                      const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, int64_t max_len, float scale, float* scratch,
                      bf16_t* out, const FusedRope& fr, Stream& s) {
  if (hd <= 128)
    attention_launch_hd<FUSED, 128>(q, ldq, n, heads, kv_heads, hd, kc, vc, slot_lists, offsets, lens, max_len, scale, scratch, out, fr, s);
  else
    attention_launch_hd<FUSED, 256>(q, ldq, n, heads, kv_heads, hd, kc, vc, slot_lists, offsets, lens, max_len, scale, scratch, out, fr, s);
}

void check_attention(const char* what, int64_t heads, int64_t kv_heads, int64_t hd) {
  if (hd % 32 != 0 || hd <= 0 || hd > attention_max_head_dim)
    fail(ErrorKind::unsupported, std::string("gpu::") + what + ": head_dim " + std::to_string(hd) + " (need a multiple of 32 up to 256)");
  if (kv_heads <= 0 || heads % kv_heads != 0) fail(ErrorKind::invalid_argument, std::string("gpu::") + what + ": heads must be a multiple of kv_heads");
}

}  // namespace

void attention(const float* q, int64_t ldq, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* kc, const bf16_t* vc,
               const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, int64_t max_len, float scale, float* scratch,
               bf16_t* out, Stream& s) {
  check_attention("attention", heads, kv_heads, hd);
  if (n <= 0) return;
  attention_launch<false>(q, ldq, n, heads, kv_heads, hd, kc, vc, slot_lists, offsets, lens, max_len, scale, scratch, out, FusedRope{}, s);
}

void norm_rope_store_attention(float* qkv, int64_t ldq, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* w_q,
                               const bf16_t* w_k, float eps, const int32_t* pos, const float* inv_freq, const int32_t* slots, bf16_t* kc,
                               bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, int64_t max_len, float scale,
                               float* scratch, bf16_t* out, Stream& s) {
  check_attention("norm_rope_store_attention", heads, kv_heads, hd);
  if (n <= 0) return;
  const FusedRope fr{w_q, w_k, eps, pos, slots, inv_freq, kc, vc};
  attention_launch<true>(qkv, ldq, n, heads, kv_heads, hd, kc, vc, slot_lists, offsets, lens, max_len, scale, scratch, out, fr, s);
}

}  // namespace hmoe::gpu
