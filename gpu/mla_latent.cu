// Latent (absorbed) multi-head latent attention, gpu::mla_attention_latent
// (gpu/mla.h). Version 2: every head of a token shares the same keys and
// values (the latent cache rows), so one block takes a group of HG heads and
// a slice of the token's context (split-K, as flash-decoding does): each
// chunk of C cache rows is read from global memory once into shared memory
// and used by all HG heads, for the scores (a thread per (head, key) dot
// product over the r + rope values) and for P.V (a thread per pair of latent
// dimensions, all HG heads). Splits write (max, sum, unnormalised output)
// partials that a second kernel combines; with one split the block writes
// the output itself. Math in fp32; the cache is bf16.
//
// Version 1 (one block per (token, head), the whole context serially) read
// the cache once per head: 344 us for 1k tokens of context on an H200.
#include <algorithm>
#include <atomic>
#include <string>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/mla.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kThreads = 256, kMaxSplits = 64, kMaxPairs = 2;  // kMaxPairs: r <= 2 * 2 * kThreads = 1024

struct LatentArgs {
  const float *q_lat, *q_pe;
  int64_t ldpe, hpe;
  int heads, r, rope, splits;
  const uint16_t* cache;
  const int32_t *slot_lists, *offsets, *lens, *skip;
  float scale;
  float* out;      // splits == 1: the final output
  float* part_ml;  // splits > 1: [(t * splits + s) * heads + h] x {max, sum}
  float* part_o;   // splits > 1: [(t * splits + s) * heads + h] x r
};

// Shared memory: q [HG][lw] fp32, keys [C][lw/2 + 2] words (bf16 pairs; a
// row stride of 2 mod 4 words keeps the 8-byte per-key score reads of 16
// lanes on distinct banks), p [C][HG], and per head the running max, sum and
// this chunk's correction.
__host__ __device__ constexpr int key_stride(int lw) { return lw / 2 + 2; }
__host__ __device__ constexpr size_t latent_smem(int hg, int c, int lw) {
  return (static_cast<size_t>(hg) * lw + static_cast<size_t>(c) * key_stride(lw) + static_cast<size_t>(c) * hg + 3 * static_cast<size_t>(hg)) * 4;
}

// grid (n, ceil(heads / HG), splits), kThreads threads.
template <int HG, int C>
__global__ void __launch_bounds__(kThreads) latent_kernel(LatentArgs a) {
  extern __shared__ float smem[];
  const int t = blockIdx.x, g = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r = a.r, lw = r + a.rope, kstride = key_stride(lw), h0 = g * HG;
  float* qs = smem;
  uint32_t* ks = reinterpret_cast<uint32_t*>(qs + HG * lw);
  float* ps = reinterpret_cast<float*>(ks + C * kstride);
  float* mx = ps + C * HG;
  float* sm = mx + HG;
  float* corr = sm + HG;
  const bool skipped = a.skip && a.skip[t];
  const int len = skipped ? 0 : a.lens[t];
  // Whole chunks per split; splits past the end get no keys (a -inf partial).
  const int per = ((len + a.splits - 1) / a.splits + C - 1) / C * C;
  const int kb = min(len, sp * per), ke = min(len, kb + per);
  const int32_t* sl = a.slot_lists + a.offsets[t];

  for (int i = tid; i < HG * lw; i += kThreads) {
    const int hh = i / lw, c = i % lw, h = h0 + hh;
    float v = 0;
    if (h < a.heads) v = c < r ? a.q_lat[(static_cast<int64_t>(t) * a.heads + h) * r + c] : a.q_pe[static_cast<int64_t>(t) * a.ldpe + h * a.hpe + (c - r)];
    qs[i] = v;
  }
  if (tid < HG) {
    mx[tid] = -INFINITY;
    sm[tid] = 0;
  }
  float acc[kMaxPairs][HG][2];
#pragma unroll
  for (int p = 0; p < kMaxPairs; ++p)
#pragma unroll
    for (int h = 0; h < HG; ++h) acc[p][h][0] = acc[p][h][1] = 0;

  const int lw8 = lw / 8;
  for (int base = kb; base < ke; base += C) {
    const int cn = min(C, ke - base);
    __syncthreads();  // the previous chunk's keys and p are no longer read
    for (int i = tid; i < cn * lw8; i += kThreads) {
      const int j = i / lw8, c8 = i % lw8;
      const uint4 u = reinterpret_cast<const uint4*>(a.cache + static_cast<int64_t>(sl[base + j]) * lw)[c8];
      uint32_t* dst = ks + j * kstride + c8 * 4;
      dst[0] = u.x;
      dst[1] = u.y;
      dst[2] = u.z;
      dst[3] = u.w;
    }
    __syncthreads();
    // Scores: thread (head pair hp, hp + HG/2; key j) over lw values, four
    // at a time: one 8-byte key load and two broadcast float4 query loads
    // per 8 FMAs (shared-memory bandwidth, not FMAs, limits this loop).
    for (int i = tid; i < HG / 2 * C; i += kThreads) {
      const int hp = i / C, j = i % C;
      float sa = -INFINITY, sb = -INFINITY;
      if (j < cn) {
        const uint2* kr = reinterpret_cast<const uint2*>(ks + j * kstride);
        const float4* qa = reinterpret_cast<const float4*>(qs + hp * lw);
        const float4* qb = reinterpret_cast<const float4*>(qs + (hp + HG / 2) * lw);
        float a0 = 0, a1 = 0, b0 = 0, b1 = 0;
        for (int c = 0; c < lw / 4; ++c) {
          const uint2 w = kr[c];
          const float k0 = __uint_as_float(w.x << 16), k1 = __uint_as_float(w.x & 0xffff0000u), k2 = __uint_as_float(w.y << 16),
                      k3 = __uint_as_float(w.y & 0xffff0000u);
          const float4 x = qa[c], y = qb[c];
          a0 += x.x * k0;
          a1 += x.y * k1;
          a0 += x.z * k2;
          a1 += x.w * k3;
          b0 += y.x * k0;
          b1 += y.y * k1;
          b0 += y.z * k2;
          b1 += y.w * k3;
        }
        sa = (a0 + a1) * a.scale;
        sb = (b0 + b1) * a.scale;
      }
      ps[j * HG + hp] = sa;
      ps[j * HG + hp + HG / 2] = sb;
    }
    __syncthreads();
    // Online softmax per head: a warp per head, a lane per key (C <= 32).
    for (int hh = warp; hh < HG; hh += kThreads / 32) {
      const float s = lane < C ? ps[lane * HG + hh] : -INFINITY;
      const float cm = warp_max(s), m_old = mx[hh], m_new = fmaxf(m_old, cm);
      const float p = lane < cn ? __expf(s - m_new) : 0.0f;
      const float psum = warp_sum(p);
      if (lane < C) ps[lane * HG + hh] = p;
      if (lane == 0) {
        const float cf = __expf(m_old - m_new);  // m_old = -inf on the first chunk: 0
        corr[hh] = cf;
        sm[hh] = sm[hh] * cf + psum;
        mx[hh] = m_new;
      }
    }
    __syncthreads();
    // P.V: thread owns latent dimension pairs tid, tid + kThreads, ...
#pragma unroll
    for (int p = 0; p < kMaxPairs; ++p)
#pragma unroll
      for (int h = 0; h < HG; ++h) {
        acc[p][h][0] *= corr[h];
        acc[p][h][1] *= corr[h];
      }
    for (int j = 0; j < cn; ++j) {
      const float4* pj = reinterpret_cast<const float4*>(ps + j * HG);
      float pv[HG];
#pragma unroll
      for (int h4 = 0; h4 < HG / 4; ++h4) {
        const float4 v = pj[h4];
        pv[h4 * 4] = v.x;
        pv[h4 * 4 + 1] = v.y;
        pv[h4 * 4 + 2] = v.z;
        pv[h4 * 4 + 3] = v.w;
      }
#pragma unroll
      for (int p = 0; p < kMaxPairs; ++p) {
        const int pair = tid + p * kThreads;
        if (2 * pair >= r) break;
        const uint32_t w = ks[j * kstride + pair];
        const float v0 = __uint_as_float(w << 16), v1 = __uint_as_float(w & 0xffff0000u);
#pragma unroll
        for (int h = 0; h < HG; ++h) {
          acc[p][h][0] += pv[h] * v0;
          acc[p][h][1] += pv[h] * v1;
        }
      }
    }
  }
  __syncthreads();
  // Write: the output (one split) or this split's partial.
#pragma unroll
  for (int p = 0; p < kMaxPairs; ++p) {
    const int pair = tid + p * kThreads;
    if (2 * pair >= r) break;
#pragma unroll
    for (int hh = 0; hh < HG; ++hh) {
      const int h = h0 + hh;
      if (h >= a.heads) break;
      const int64_t row = static_cast<int64_t>(t) * a.splits + sp;
      if (a.splits == 1) {
        const float inv = len > 0 ? 1.0f / sm[hh] : 0.0f;
        float2* o = reinterpret_cast<float2*>(a.out + (static_cast<int64_t>(t) * a.heads + h) * r) + pair;
        *o = make_float2(acc[p][hh][0] * inv, acc[p][hh][1] * inv);
      } else {
        float2* o = reinterpret_cast<float2*>(a.part_o + (row * a.heads + h) * r) + pair;
        *o = make_float2(acc[p][hh][0], acc[p][hh][1]);
      }
    }
  }
  if (a.splits > 1 && tid < HG && h0 + tid < a.heads) {
    const int64_t row = (static_cast<int64_t>(t) * a.splits + sp) * a.heads + h0 + tid;
    a.part_ml[2 * row] = mx[tid];
    a.part_ml[2 * row + 1] = sm[tid];
  }
}

// grid (n, heads), 128 threads: out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
// The first warp turns the splits' (max, sum) into weights; then each
// thread sums its dimensions over the splits (independent loads, unrolled).
__global__ void latent_combine_kernel(LatentArgs a) {
  __shared__ float wsh[kMaxSplits];
  const int t = blockIdx.x, h = blockIdx.y, r = a.r, S = a.splits, tid = threadIdx.x;
  const int64_t row0 = static_cast<int64_t>(t) * S * a.heads + h;  // split s: row0 + s * heads
  if (tid < 32) {
    float m[2], l[2];
    for (int k = 0; k < 2; ++k) {
      const int sp = tid + 32 * k;
      m[k] = sp < S ? a.part_ml[2 * (row0 + static_cast<int64_t>(sp) * a.heads)] : -INFINITY;
      l[k] = sp < S ? a.part_ml[2 * (row0 + static_cast<int64_t>(sp) * a.heads) + 1] : 0.0f;
    }
    const float M = warp_max(fmaxf(m[0], m[1]));
    float e[2];
    for (int k = 0; k < 2; ++k) e[k] = M == -INFINITY || m[k] == -INFINITY ? 0.0f : __expf(m[k] - M);
    const float L = warp_sum(e[0] * l[0] + e[1] * l[1]);
    const float inv = L > 0 ? 1.0f / L : 0.0f;  // no keys at all (skipped or empty): zeros
    for (int k = 0; k < 2; ++k)
      if (tid + 32 * k < S) wsh[tid + 32 * k] = e[k] * inv;
  }
  __syncthreads();
  float* dst = a.out + (static_cast<int64_t>(t) * a.heads + h) * r;
  for (int d = tid; d < r; d += blockDim.x) {
    float o = 0;
#pragma unroll 8
    for (int sp = 0; sp < S; ++sp) o += wsh[sp] * a.part_o[(row0 + static_cast<int64_t>(sp) * a.heads) * r + d];
    dst[d] = o;
  }
}

// Per device, cached (a decode step calls here once per layer): the SM
// count, and whether each kernel variant has its shared-memory limit raised.
constexpr int kMaxDevices = 64;
std::atomic<int> g_sms[kMaxDevices];
std::atomic<bool> g_smem_set[kMaxDevices][2];

int current_device() {
  int dev = 0;
  HMOE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) fail(ErrorKind::unsupported, "gpu::mla_attention_latent: device index " + std::to_string(dev));
  return dev;
}

int device_sms() {
  const int dev = current_device();
  int sms = g_sms[dev].load(std::memory_order_relaxed);
  if (sms == 0) {
    HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    sms = std::max(1, sms);
    g_sms[dev].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

// Heads per block: 16 while the shared memory fits 96 KiB (every target
// allows 99 KiB per block), else 8 with half-size chunks.
bool wide_groups(int64_t lw) { return latent_smem(16, 32, static_cast<int>(lw)) <= 96 * 1024; }

int64_t head_groups(int64_t heads, int64_t lw) { return (heads + (wide_groups(lw) ? 16 : 8) - 1) / (wide_groups(lw) ? 16 : 8); }

// Splits of each token's context: enough blocks for two waves over the SMs.
int64_t splits_for(int64_t n, int64_t heads, int64_t lw, int sms) {
  const int64_t blocks = n * head_groups(heads, lw);
  return std::clamp<int64_t>((2 * sms + blocks - 1) / blocks, 1, kMaxSplits);
}

template <int HG, int C>
void launch(const LatentArgs& a, int64_t n, int64_t groups, Stream& s) {
  const size_t smem = latent_smem(HG, C, a.r + a.rope);
  // Raised once per device to the most either variant can ask for (96 KiB).
  std::atomic<bool>& set = g_smem_set[current_device()][HG == 16 ? 0 : 1];
  if (!set.load(std::memory_order_acquire)) {
    HMOE_CUDA_CHECK(cudaFuncSetAttribute(latent_kernel<HG, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    set.store(true, std::memory_order_release);
  }
  latent_kernel<HG, C><<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(groups), static_cast<unsigned>(a.splits)), kThreads, smem, cs(s)>>>(a);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace

int64_t mla_attention_latent_workspace(int64_t n, int64_t heads, int64_t r, int64_t rope) {
  if (n <= 0) return 0;
  const int64_t splits = splits_for(n, heads, r + rope, device_sms());
  return splits > 1 ? n * splits * heads * (r + 2) : 0;
}

void mla_attention_latent(const float* q_lat, const float* q_pe, int64_t ldpe, int64_t hpe, int64_t n, int64_t heads, int64_t r, int64_t rope,
                          const bf16_t* cache, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, const int32_t* skip,
                          float scale, float* o_lat, float* work, Stream& s) {
  if (r % 8 != 0 || rope % 8 != 0 || r <= 0 || r > 2 * kMaxPairs * kThreads)
    fail(ErrorKind::unsupported, "gpu::mla_attention_latent: kv_lora_rank " + std::to_string(r) + " / rope " + std::to_string(rope) +
                                     " (need multiples of 8, kv_lora_rank <= 1024)");
  if (n <= 0) return;
  if (n > INT32_MAX || heads > 65535 * 8) fail(ErrorKind::unsupported, "gpu::mla_attention_latent: too many tokens or heads");
  const int64_t lw = r + rope, groups = head_groups(heads, lw);
  if (!wide_groups(lw) && latent_smem(8, 16, static_cast<int>(lw)) > 96 * 1024)
    fail(ErrorKind::unsupported, "gpu::mla_attention_latent: kv_lora_rank + rope " + std::to_string(lw) + " needs too much shared memory");
  LatentArgs a{q_lat, q_pe, ldpe, hpe, static_cast<int>(heads), static_cast<int>(r), static_cast<int>(rope), 1, cache, slot_lists, offsets, lens,
               skip, scale, o_lat, nullptr, nullptr};
  if (work) {
    a.splits = static_cast<int>(splits_for(n, heads, lw, device_sms()));
    a.part_ml = work;
    a.part_o = work + 2 * n * a.splits * heads;
  }
  if (wide_groups(lw)) launch<16, 32>(a, n, groups, s);
  else launch<8, 16>(a, n, groups, s);
  if (a.splits > 1) {
    latent_combine_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), 128, 0, cs(s)>>>(a);
    HMOE_CUDA_LAUNCHED();
  }
}

}  // namespace hmoe::gpu
