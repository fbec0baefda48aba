// The activation quantizer of the integer GGUF path (numa/quant_gguf_q8.h),
// its scalar reference, the run-time dispatch and the threaded product.
#include "numa/quant_gguf_q8.h"
#include "numa/quant_gguf_lowbit.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "configs/error.h"

namespace hmoe::cpu {

namespace {


// The low-bit types (numa/quant_gguf_lowbit.h) share the K types' activation layout (sums per 16).
bool is_k(ExtType t) { return t == ExtType::q4_k || t == ExtType::q5_k || t == ExtType::q6_k || lowbit_type(static_cast<uint32_t>(t)); }
bool is_b32(ExtType t) { return t == ExtType::q8_0 || t == ExtType::q4_0 || t == ExtType::q5_0; }
// Q4_K/Q5_K: a 64-byte load of codes holds sub-blocks (0,2) in its low
// nibbles and (1,3) in its high ones; the activation's sub-blocks are stored
// in that order (the permutation is its own inverse).
constexpr int kSubOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
// 32-blocks: the zero point the codes carry.
int zero_of(ExtType t) { return t == ExtType::q8_0 ? 128 : t == ExtType::q4_0 ? 8 : 16; }
// 32-blocks: which block of a pair int32 lane l (bytes 4l..4l+3) belongs to.
int lane_block(ExtType t, int l) { return t == ExtType::q8_0 ? l / 8 : (l / 4) % 2; }

}  // namespace

bool gguf_q8_applies(const Mat& w) {
  if (w.quant != Quant::ext || best_isa() == Isa::scalar) return false;
  if (lowbit_type(w.ext)) return lowbit_q8_applies(w);
  const auto t = static_cast<ExtType>(w.ext);
  if (is_k(t)) return w.cols > 0 && w.cols % 256 == 0;
  if (is_b32(t)) return w.cols > 0 && w.cols % 64 == 0;
  return false;
}

bool gguf_q8_same_layout(const Mat& a, const Mat& b) { return a.quant == Quant::ext && b.quant == Quant::ext && a.ext == b.ext && a.cols == b.cols; }

void Q8Acts::reset(int64_t rows, const Mat& w) {
  static std::atomic<uint64_t> stamps{0};
  stamp = stamps.fetch_add(1, std::memory_order_relaxed) + 1;
  type = static_cast<ExtType>(w.ext);
  n = rows;
  cols = w.cols;
  block = is_k(type) ? 256 : 32;
  q.resize(static_cast<size_t>(n * cols));
  d.resize(static_cast<size_t>(n * (cols / block)));
  if (is_k(type)) bsum.resize(static_cast<size_t>(n * (cols / 256) * 16));
  else {
    init.resize(static_cast<size_t>(n * (cols / 64) * 16));
    dv.resize(static_cast<size_t>(n * (cols / 64) * 16));
  }
  seed.resize(static_cast<size_t>(type == ExtType::q6_k ? n * (cols / 16) : is_b32(type) ? n * (cols / 32) : 0));
}

int64_t Q8Acts::pos(int64_t k) const {
  if (type == ExtType::q4_k || type == ExtType::q5_k) {
    const int64_t e = k % 256;
    return k - e + kSubOrder[e / 32] * 32 + e % 32;
  }
  if (type == ExtType::q4_0 || type == ExtType::q5_0) {
    const int64_t e = k % 64, blk = e / 32, h = (e % 32) / 16;
    return k - e + (h * 2 + blk) * 16 + e % 16;
  }
  return k;
}

float Q8Acts::value(int64_t t, int64_t k) const {
  return static_cast<float>(q[static_cast<size_t>(t * cols + pos(k))]) * d[static_cast<size_t>(t * (cols / block) + k / block)];
}

void Q8Acts::quantize(int64_t t, const float* x) {
  int8_t* qt = q.data() + t * cols;
  float* dt = d.data() + t * (cols / block);
  int8_t tmp[256];
  const Isa isa = best_isa();
  const bool v512 = isa == Isa::avx512 && detail::q8_has_vnni(), v256 = !v512 && isa != Isa::scalar;
  for (int64_t b = 0; b < cols / block; ++b) {
    if (v512 && detail::q8_quantize_block_avx512(*this, t, b, x + b * block)) continue;
    if (v256 && detail::q8_quantize_block_avx2(*this, t, b, x + b * block)) continue;
    const float* xb = x + b * block;
    float amax = 0;
    for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(xb[i]));
    // A block holding inf or NaN gets scale NaN and codes 0: its products
    // come out NaN, as on the exact path, without converting NaN to int8.
    const bool finite = amax <= std::numeric_limits<float>::max();
    const float db = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    const float id = finite && amax > 0 ? 127.0f / amax : 0.0f;
    dt[b] = db;
    for (int64_t i = 0; i < block; ++i) tmp[i] = static_cast<int8_t>(std::clamp(std::nearbyint(xb[i] * id), -127.0f, 127.0f));
    if (is_k(type)) {
      int16_t* bs = bsum.data() + (t * (cols / 256) + b) * 16;
      std::fill(bs, bs + 16, int16_t{0});
      const int run = type == ExtType::q6_k || lowbit_type(static_cast<uint32_t>(type)) ? 16 : 32;
      for (int i = 0; i < 256; ++i) bs[i / run] = static_cast<int16_t>(bs[i / run] + tmp[i]);
    }
    for (int64_t i = 0; i < block; ++i) qt[pos(b * block + i)] = tmp[i];
  }
  if (type == ExtType::q6_k) {
    const int16_t* bs = bsum.data() + t * (cols / 256) * 16;
    int32_t* sd = seed.data() + t * (cols / 16);
    for (int64_t i = 0; i < cols / 16; ++i) sd[i] = -32 * bs[i];
  }
  if (is_b32(type)) {
    const int z = zero_of(type);
    for (int64_t p = 0; p < cols / 64; ++p) {
      int32_t sum[2] = {0, 0};
      for (int blk = 0; blk < 2; ++blk) {
        // the block's 32 codes: in place (Q8_0), or 16 at (2h + blk) * 16 for h = 0, 1 (Q4_0/Q5_0: see pos)
        const int8_t* g = qt + p * 64;
        if (type == ExtType::q8_0)
          for (int i = 0; i < 32; ++i) sum[blk] += g[blk * 32 + i];
        else
          for (int i = 0; i < 16; ++i) sum[blk] += g[blk * 16 + i] + g[(2 + blk) * 16 + i];
        seed[static_cast<size_t>(t * (cols / 32) + 2 * p + blk)] = -z * sum[blk];
      }
      int32_t* in = init.data() + (t * (cols / 64) + p) * 16;
      float* dl = dv.data() + (t * (cols / 64) + p) * 16;
      bool seeded[2] = {false, false};
      for (int l = 0; l < 16; ++l) {
        const int blk = lane_block(type, l);
        in[l] = seeded[blk] ? 0 : -z * sum[blk];
        seeded[blk] = true;
        dl[l] = dt[2 * p + blk];
      }
    }
  }
}

void Q8Acts::copy_row(int64_t t, const Q8Acts& src, int64_t ts) {
  std::memcpy(q.data() + t * cols, src.q.data() + ts * cols, static_cast<size_t>(cols));
  const int64_t nb = cols / block;
  std::memcpy(d.data() + t * nb, src.d.data() + ts * nb, static_cast<size_t>(nb) * sizeof(float));
  if (is_k(type)) {
    std::memcpy(bsum.data() + t * (cols / 256) * 16, src.bsum.data() + ts * (cols / 256) * 16, static_cast<size_t>(cols / 256) * 16 * sizeof(int16_t));
  } else {
    const size_t lanes = static_cast<size_t>(cols / 64) * 16;
    std::memcpy(init.data() + t * static_cast<int64_t>(lanes), src.init.data() + ts * static_cast<int64_t>(lanes), lanes * sizeof(int32_t));
    std::memcpy(dv.data() + t * static_cast<int64_t>(lanes), src.dv.data() + ts * static_cast<int64_t>(lanes), lanes * sizeof(float));
  }
  if (!seed.empty()) {
    const int64_t per = type == ExtType::q6_k ? cols / 16 : cols / 32;
    std::memcpy(seed.data() + t * per, src.seed.data() + ts * per, static_cast<size_t>(per) * sizeof(int32_t));
  }
}

void gemm_rows_q8_reference(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = r0; r < r1; ++r) {
    ext_row_to_f32(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      double s = 0;
      for (int64_t k = 0; k < w.cols; ++k) s += static_cast<double>(row[static_cast<size_t>(k)]) * xa.value(t0 + t, k);
      y[t * ldy + r] = static_cast<float>(s);
    }
  }
}

void gemm_rows_q8(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  if (static_cast<ExtType>(w.ext) != xa.type || w.cols != xa.cols)
    fail(ErrorKind::internal, "gemm_rows_q8: activations quantized for " + std::string(ext_type_info(static_cast<uint32_t>(xa.type))->name) +
                                  " [" + std::to_string(xa.cols) + "], weights are " + ext_type_name(w) + " [" + std::to_string(w.cols) + "]");
  if (lowbit_type(w.ext)) return lowbit_gemm_rows_q8(xa, t0, n, w, r0, r1, y, ldy);
  const Isa isa = best_isa();
  if (isa == Isa::avx512 && detail::q8_has_vnni()) detail::q8_rows_avx512(xa, t0, n, w, r0, r1, y, ldy);
  else if (isa != Isa::scalar) detail::q8_rows_avx2(xa, t0, n, w, r0, r1, y, ldy);
  else gemm_rows_q8_reference(xa, t0, n, w, r0, r1, y, ldy);
}

void gemm_q8(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool) {
  (void)detail::q8_amx_mode();  // the first call probes AMX (once per process): here, not in the workers
  thread_local Q8Acts tl;  // reused between calls; the workers use it through the reference
  Q8Acts& xa = tl;
  xa.reset(n, w);
  auto quant = [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) xa.quantize(t, x + t * w.cols);
  };
  if (pool && n * w.cols >= (1 << 15)) pool->parallel_for(n, quant, 4);
  else quant(0, n, 0);
  constexpr int64_t kBlock = 32;  // the tile kernels' row group
  const int64_t blocks = (w.rows + kBlock - 1) / kBlock;
  auto body = [&](int64_t b0, int64_t b1, int) { gemm_rows_q8(xa, 0, n, w, b0 * kBlock, std::min(w.rows, b1 * kBlock), y, w.rows); };
  if (pool && w.rows * w.cols * n >= 32768) pool->parallel_for(blocks, body);
  else body(0, blocks, 0);
}

}  // namespace hmoe::cpu
