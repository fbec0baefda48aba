// AMX-BF16 prefill kernels on ggml block weights (numa/quant_gguf_amx.h):
// the run-time probe, the activation packing, the strip driver (hardware and
// emulated tiles), the scalar reference and the threaded product.
//
// v1: strips of 32 weight rows, dequantized into an L2 scratch up to four
// strips (128 rows) at a time; for each pair of token blocks (32 tokens)
// the four strips run one pass each, so a token pair's B tiles (32 x cols
// bf16) are read from memory once per 128 rows and from L1/L2 after that.
#include "numa/quant_gguf_amx.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cpuid.h>
#include <cstdio>
#include <cstring>

#include "configs/error.h"
#include "io/dtype.h"
#include "numa/quant_gguf.h"
#include "numa/thread_pool.h"

namespace hmoe::cpu {

namespace {

constexpr int64_t kStrip = 32;      // weight rows per strip (two A tiles)
constexpr int64_t kGroupStrips = 4;  // strips dequantized per group

bool self_check();

bool probe_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
  if (!tile || !bf16) return false;
  // Linux >= 5.16 keeps the 8 KiB tile data state off until a process asks.
  constexpr long kGetPerm = 0x1022, kReqPerm = 0x1023, kXtileData = 18;
  if (syscall(SYS_arch_prctl, kReqPerm, kXtileData) != 0) return false;
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kGetPerm, &mask) != 0) return false;
  return ((mask >> kXtileData) & 1u) && self_check();
}

std::atomic<int> g_mode{-1};  // -1: not decided yet
std::atomic<int64_t> g_min_tokens{0};  // off unless set (batch invariance, see the setting)

// ---- emulated tiles ---------------------------------------------------------------
struct EmuTiles {
  alignas(64) uint8_t t[8][1024];
};
thread_local EmuTiles g_emu;

void emu_zero(int i) { std::memset(g_emu.t[i], 0, 1024); }
void emu_load(int i, const void* p, int64_t stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(g_emu.t[i] + 64 * r, static_cast<const uint8_t*>(p) + r * stride, 64);
}
void emu_store(int i, void* p, int64_t stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, g_emu.t[i] + 64 * r, 64);
}
// tdpbf16ps: C[m][n] += sum_p A[m][2p] B[p][2n] + A[m][2p+1] B[p][2n+1].
void emu_dp(int ci, int ai, int bi) {
  float c[16][16];
  uint16_t a[16][32], b[16][32];
  std::memcpy(c, g_emu.t[ci], 1024);
  std::memcpy(a, g_emu.t[ai], 1024);
  std::memcpy(b, g_emu.t[bi], 1024);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float s = c[m][n];
      for (int p = 0; p < 16; ++p)
        s += bf16_to_f32(a[m][2 * p]) * bf16_to_f32(b[p][2 * n]) + bf16_to_f32(a[m][2 * p + 1]) * bf16_to_f32(b[p][2 * n + 1]);
      c[m][n] = s;
    }
  std::memcpy(g_emu.t[ci], c, 1024);
}

#define AMX_ATTR
#define AMX_PASS pass_emu
#define TILE_ZERO(i) emu_zero(i)
#define TILE_LOAD(i, p, s) emu_load(i, p, s)
#define TILE_DP(c, a, b) emu_dp(c, a, b)
#define TILE_STORE(i, p, s) emu_store(i, p, s)
#include "numa/detail/amx_pass.inc"
#undef AMX_ATTR
#undef AMX_PASS
#undef TILE_ZERO
#undef TILE_LOAD
#undef TILE_DP
#undef TILE_STORE

// ---- hardware tiles ---------------------------------------------------------------
// Own asm rather than GCC 12's <amxtileintrin.h>: its _tile_loadconfig names
// only the first 8 bytes of the configuration as read, so the compiler drops
// the stores of the row and column sizes (ldtilecfg then faults), and its
// tile loads/stores do not tell the compiler that memory is read or written.
#define AMX_ATTR
#define AMX_PASS pass_hw
#define TILE_ZERO(i) __asm__ volatile("tilezero %%tmm" #i ::)
#define TILE_LOAD(i, p, s) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #i ::"r"(p), "r"(static_cast<int64_t>(s)) : "memory")
#define TILE_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TILE_STORE(i, p, s) __asm__ volatile("tilestored %%tmm" #i ", (%0,%1,1)" ::"r"(p), "r"(static_cast<int64_t>(s)) : "memory")
#include "numa/detail/amx_pass.inc"

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Palette 1, tiles 0-7 all 16 rows x 64 bytes.
void hw_begin() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
}
void hw_end() { __asm__ volatile("tilerelease" ::: "memory"); }

// `iters` x 8 tdpbf16ps on zeroed tiles (no loads, no denormals).
void hw_spin(int64_t iters) {
  hw_begin();
  TILE_ZERO(0);
  TILE_ZERO(1);
  TILE_ZERO(2);
  TILE_ZERO(3);
  TILE_ZERO(4);
  TILE_ZERO(5);
  TILE_ZERO(6);
  TILE_ZERO(7);
  for (int64_t it = 0; it < iters; ++it) {
    TILE_DP(0, 4, 6);
    TILE_DP(1, 4, 7);
    TILE_DP(2, 5, 6);
    TILE_DP(3, 5, 7);
    TILE_DP(0, 4, 6);
    TILE_DP(1, 4, 7);
    TILE_DP(2, 5, 6);
    TILE_DP(3, 5, 7);
  }
  hw_end();
}
#undef AMX_ATTR
#undef AMX_PASS
#undef TILE_ZERO
#undef TILE_LOAD
#undef TILE_DP
#undef TILE_STORE

// One 2 x 2 pass on small integers (every sum exact in fp32) on the hardware
// tiles, against the emulation. Run in a forked child by probe_amx, so that
// a fault (a kernel or hypervisor that does not really give the tile state)
// costs the child, not the server: 0 = equal, 1 = different.
int self_check_child() {
  constexpr int64_t kch = 2;
  alignas(64) static uint16_t wt[kch * 1024], xb[2 * kch * 512];
  alignas(64) static float c_hw[1024], c_emu[1024];
  for (int64_t i = 0; i < kch * 1024; ++i) wt[i] = f32_to_bf16(static_cast<float>(static_cast<int>((i * 7) % 5) - 2));
  for (int64_t i = 0; i < 2 * kch * 512; ++i) xb[i] = f32_to_bf16(static_cast<float>(static_cast<int>((i * 3) % 7) - 3));
  hw_begin();
  pass_hw<2, 2>(wt, xb, kch * 512, kch, c_hw);
  hw_end();
  pass_emu<2, 2>(wt, xb, kch * 512, kch, c_emu);
  return std::memcmp(c_hw, c_emu, sizeof c_hw) == 0 ? 0 : 1;
}

bool self_check() {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    // the default action for a fault: no crash handler of the parent's (a test
    // framework's, a server's) reports it as the parent's own crash
    for (int sig : {SIGILL, SIGSEGV, SIGBUS, SIGFPE}) std::signal(sig, SIG_DFL);
    _exit(self_check_child());
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return false;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  if (WIFSIGNALED(status))
    std::fprintf(stderr, "hmoe: AMX tiles fault here (signal %d in a self-check); GGUF prefill uses the 8-bit path\n", WTERMSIG(status));
  else std::fprintf(stderr, "hmoe: AMX tiles gave wrong results in a self-check; GGUF prefill uses the 8-bit path\n");
  return false;
}

template <bool HW>
void run_pass(int mb, int nb, const uint16_t* wt, const uint16_t* xb, int64_t bstride, int64_t kch, float* c) {
  if constexpr (HW) {
    if (mb == 2) nb == 2 ? pass_hw<2, 2>(wt, xb, bstride, kch, c) : pass_hw<2, 1>(wt, xb, bstride, kch, c);
    else nb == 2 ? pass_hw<1, 2>(wt, xb, bstride, kch, c) : pass_hw<1, 1>(wt, xb, bstride, kch, c);
  } else {
    if (mb == 2) nb == 2 ? pass_emu<2, 2>(wt, xb, bstride, kch, c) : pass_emu<2, 1>(wt, xb, bstride, kch, c);
    else nb == 2 ? pass_emu<1, 2>(wt, xb, bstride, kch, c) : pass_emu<1, 1>(wt, xb, bstride, kch, c);
  }
}

template <bool HW>
void rows_impl(const AmxActs& xa, int64_t b0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t kch = w.cols / 32, bstride = w.cols * 16, strip_elems = kch * 1024;
  thread_local std::vector<uint16_t> scratch;
  if (scratch.size() < static_cast<size_t>(kGroupStrips * strip_elems)) scratch.resize(static_cast<size_t>(kGroupStrips * strip_elems));
  alignas(64) float c[4 * 256];
  const int64_t nb = (n + 15) / 16;
  if constexpr (HW) hw_begin();
  for (int64_t g0 = r0; g0 < r1; g0 += kGroupStrips * kStrip) {
    const int64_t g1 = std::min(r1, g0 + kGroupStrips * kStrip);
    const int64_t strips = (g1 - g0 + kStrip - 1) / kStrip;
    for (int64_t s = 0; s < strips; ++s) {
      const int64_t rs = g0 + s * kStrip, nr = std::min(kStrip, g1 - rs);
      uint16_t* wt = scratch.data() + s * strip_elems;
      detail::ext_rows_to_bf16_tiles(w, rs, nr, wt);
      // rows past the matrix in a strip's last used A tile: zeros
      const int64_t used = nr > 16 ? 32 : 16;
      if (nr < used)
        for (int64_t kk = 0; kk < kch; ++kk) std::memset(wt + kk * 1024 + nr * 32, 0, static_cast<size_t>((used - nr) * 32) * sizeof(uint16_t));
    }
    for (int64_t tb = 0; tb < nb; tb += 2) {
      const int nbb = nb - tb >= 2 ? 2 : 1;
      const uint16_t* xb = xa.p.data() + (b0 + tb) * bstride;
      for (int64_t s = 0; s < strips; ++s) {
        const int64_t rs = g0 + s * kStrip, nr = std::min(kStrip, g1 - rs);
        const int mb = nr > 16 ? 2 : 1;
        run_pass<HW>(mb, nbb, scratch.data() + s * strip_elems, xb, bstride, kch, c);
        for (int im = 0; im < mb; ++im)
          for (int in = 0; in < nbb; ++in) {
            const float* ct = c + (im * 2 + in) * 256;
            const int64_t rows_here = std::min<int64_t>(16, nr - im * 16);
            const int64_t t0 = (tb + in) * 16, toks = std::min<int64_t>(16, n - t0);
            for (int64_t j = 0; j < toks; ++j) {
              float* dst = y + (t0 + j) * ldy + rs + im * 16;
              for (int64_t m = 0; m < rows_here; ++m) dst[m] = ct[m * 16 + j];
            }
          }
      }
    }
  }
  if constexpr (HW) hw_end();
}

void check_args(const AmxActs& xa, int64_t b0, int64_t n, const Mat& w) {
  if (w.quant != Quant::ext || w.cols % 32 != 0 || w.cols != xa.cols || b0 < 0 || b0 + (n + 15) / 16 > xa.blocks)
    fail(ErrorKind::internal, "gemm_rows_amx: weights " + ext_type_name(w) + " [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                                  "], activations [" + std::to_string(xa.blocks) + " blocks, " + std::to_string(xa.cols) + "], tokens from block " +
                                  std::to_string(b0) + " x " + std::to_string(n));
}

}  // namespace

bool amx_hardware() {
  static const bool ok = probe_amx();
  return ok;
}

AmxMode amx_mode() {
  int m = g_mode.load(std::memory_order_relaxed);
  if (m < 0) {
    m = static_cast<int>(amx_hardware() ? AmxMode::hardware : AmxMode::off);
    g_mode.store(m, std::memory_order_relaxed);
  }
  return static_cast<AmxMode>(m);
}

void set_amx_mode(AmxMode m) {
  if (m == AmxMode::hardware && !amx_hardware()) fail(ErrorKind::invalid_argument, "AMX-BF16 tiles are not available on this CPU / kernel");
  g_mode.store(static_cast<int>(m), std::memory_order_relaxed);
}

void set_amx_min_tokens(int64_t n) {
  if (n < 0) fail(ErrorKind::invalid_argument, "HMOE_CPU_AMX_MIN_TOKENS / --cpu-amx-min-tokens must be >= 0, got " + std::to_string(n));
  g_min_tokens.store(n, std::memory_order_relaxed);
}
int64_t amx_min_tokens() { return g_min_tokens.load(std::memory_order_relaxed); }

bool amx_applies(const Mat& w) { return w.quant == Quant::ext && w.cols > 0 && w.cols % 32 == 0 && amx_mode() != AmxMode::off; }

bool amx_wanted(const Mat& w, int64_t n) {
  const int64_t m = amx_min_tokens();
  return m > 0 && n >= m && amx_applies(w);
}

void AmxActs::reset(int64_t nblocks, int64_t ncols) {
  if (ncols % 32 != 0) fail(ErrorKind::internal, "AmxActs: columns " + std::to_string(ncols) + " not a multiple of 32");
  blocks = nblocks;
  cols = ncols;
  p.resize(static_cast<size_t>(blocks * cols * 16));
}

void AmxActs::set_row(int64_t b, int j, const float* x) {
  uint16_t* base = p.data() + b * cols * 16 + j * 2;
  if (!x) {
    for (int64_t q = 0; q < cols / 2; ++q) base[q * 32] = base[q * 32 + 1] = 0;
    return;
  }
  for (int64_t q = 0; q < cols / 2; ++q) {
    base[q * 32] = f32_to_bf16(x[2 * q]);
    base[q * 32 + 1] = f32_to_bf16(x[2 * q + 1]);
  }
}

void AmxActs::pack(int64_t b0, const float* x, int64_t ldx, int64_t n) {
  for (int64_t t = 0; t < (n + 15) / 16 * 16; ++t) set_row(b0 + t / 16, static_cast<int>(t % 16), t < n ? x + t * ldx : nullptr);
}

float AmxActs::value(int64_t b, int j, int64_t k) const { return bf16_to_f32(p[static_cast<size_t>(b * cols * 16 + (k / 2) * 32 + j * 2 + k % 2)]); }

void gemm_rows_amx(const AmxActs& xa, int64_t b0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  check_args(xa, b0, n, w);
  switch (amx_mode()) {
    case AmxMode::hardware: return rows_impl<true>(xa, b0, n, w, r0, r1, y, ldy);
    case AmxMode::emulate: return rows_impl<false>(xa, b0, n, w, r0, r1, y, ldy);
    case AmxMode::off: break;
  }
  fail(ErrorKind::internal, "gemm_rows_amx: AMX is off");
}

void gemm_rows_amx_reference(const AmxActs& xa, int64_t b0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  check_args(xa, b0, n, w);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = r0; r < r1; ++r) {
    ext_row_to_f32(w, r, row.data());
    for (auto& v : row) v = bf16_to_f32(f32_to_bf16(v));
    for (int64_t t = 0; t < n; ++t) {
      double s = 0;
      for (int64_t k = 0; k < w.cols; ++k) s += static_cast<double>(row[static_cast<size_t>(k)]) * xa.value(b0 + t / 16, static_cast<int>(t % 16), k);
      y[t * ldy + r] = static_cast<float>(s);
    }
  }
}

void gemm_amx(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool) {
  thread_local AmxActs tl;  // reused between calls; the workers use it through the reference
  AmxActs& xa = tl;
  const int64_t nb = (n + 15) / 16;
  xa.reset(nb, w.cols);
  auto pack = [&](int64_t b, int64_t e, int) {
    for (int64_t blk = b; blk < e; ++blk) xa.pack(blk, x + blk * 16 * w.cols, w.cols, std::min<int64_t>(16, n - blk * 16));
  };
  if (pool) pool->parallel_for(nb, pack);
  else pack(0, nb, 0);
  // Row groups: up to 4 strips, fewer where that leaves threads idle.
  const int threads = pool ? pool->size() : 1;
  const int64_t strips = (w.rows + kStrip - 1) / kStrip;
  const int64_t per = std::clamp<int64_t>(strips / (2 * static_cast<int64_t>(threads)), 1, kGroupStrips);
  const int64_t groups = (strips + per - 1) / per;
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t g = b; g < e; ++g) gemm_rows_amx(xa, 0, n, w, g * per * kStrip, std::min(w.rows, (g + 1) * per * kStrip), y, w.rows);
  };
  if (pool && groups > 1) pool->parallel_for(groups, body, 1, 1);
  else body(0, groups, 0);
}

double amx_bf16_peak_flops(numa::ThreadPool* pool) {
  if (!amx_hardware()) return 0.0;
  constexpr int64_t kIters = 200000;
  constexpr double kFlopsPerIter = 8.0 * 16 * 16 * 32 * 2;
  hw_spin(1000);  // first use: the kernel grows this thread's state
  const int threads = pool ? pool->size() : 1;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    if (pool) pool->parallel_for(threads, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hw_spin(kIters);
      }, 1, 1);
    else hw_spin(kIters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, kFlopsPerIter * kIters * threads / s);
  }
  return best;
}

namespace detail {

bool amx_self_check() { return self_check(); }

bool has_avx512_bf16() {
  static const bool v = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  }();
  return v;
}

void ext_rows_to_bf16_tiles(const Mat& w, int64_t r0, int64_t nr, uint16_t* out) {
  if (has_avx512_bf16() && best_isa() == Isa::avx512) return ext_rows_to_bf16_tiles_avx512(w, r0, nr, out);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t i = 0; i < nr; ++i) {
    ext_row_to_f32(w, r0 + i, row.data());
    for (int64_t k = 0; k < w.cols; ++k) out[((k / 32) * 32 + i) * 32 + k % 32] = f32_to_bf16(row[static_cast<size_t>(k)]);
  }
}

}  // namespace detail

}  // namespace hmoe::cpu
