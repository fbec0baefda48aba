// bench_simd_pipes: which AVX2 instructions the CPU runs side by side. The
// AVX2 kernels (numa/quant_gguf_q8_avx2*.cpp, engine/ops/cpu_attention_avx2.cpp)
// are laid out by these figures: on a Zen 3 core vpmaddubsw and vpmaddwd
// share two pipes, which vpsignb, vpblendvb, the fp32 multiplies and
// conversions partly use too, vpmovsxbw / vpmovzxwd issue below one a cycle
// and hold back both kinds, while byte shuffles, unpacks and shifts run
// beside the multiplies.
//
// Method: register-only loops of 32 instructions per iteration, each
// writing one of 8 registers from a constant one (no instruction waits on
// another: throughput, not latency); a mix "a, b" issues 8 a, 8 b, 8 a, 8 b
// ("a x3, b": 24 a, 8 b). vmulps stands for the fp32 FMAs (same pipes on the
// cores we know; an FMA must read its accumulator). The clock is a chain of
// dependent vpaddd (one cycle each on every x86 core we know). Prints
// instructions per cycle, best of 5 runs.
//
// usage: bench_simd_pipes [--seconds S]   (x86-64 with AVX2 and FMA)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>

namespace {

alignas(64) float g_mem[16] = {1.0f};

#define HMOE_ONE(name, text)                                                    \
  struct name {                                                                 \
    __attribute__((target("avx2,fma"), always_inline)) static void op(__m256i& r, __m256i b) { asm volatile(text : "=x"(r) : "x"(b), "m"(g_mem[0])); } \
  };
// %0: the destination (written only: no instruction waits on another), %1: a constant register, %2: memory
HMOE_ONE(Add, "vpaddd %1, %1, %0")
HMOE_ONE(Maddubs, "vpmaddubsw %1, %1, %0")
HMOE_ONE(Madd, "vpmaddwd %1, %1, %0")
HMOE_ONE(Sign, "vpsignb %1, %1, %0")
HMOE_ONE(Blendv, "vpblendvb %1, %1, %1, %0")
HMOE_ONE(Shufb, "vpshufb %1, %1, %0")
HMOE_ONE(Unpack, "vpunpcklwd %1, %1, %0")
HMOE_ONE(Srlw, "vpsrlw $4, %1, %0")
HMOE_ONE(Slld, "vpslld $16, %1, %0")
HMOE_ONE(Pmovzx, "vpmovzxwd %x1, %0")
HMOE_ONE(Pmovsx, "vpmovsxbw %x1, %0")
HMOE_ONE(Cvt, "vcvtdq2ps %1, %0")
HMOE_ONE(Mul, "vmulps %1, %1, %0")
HMOE_ONE(Bcast, "vbroadcastss %2, %0")
#undef HMOE_ONE

template <class A, class B, class C, class D>
__attribute__((target("avx2,fma"), noinline)) double run(long iters) {
  __m256i r0 = _mm256_set1_epi8(3), r1 = _mm256_set1_epi8(5), r2 = _mm256_set1_epi8(7), r3 = _mm256_set1_epi8(9), r4 = _mm256_set1_epi8(11),
          r5 = _mm256_set1_epi8(13), r6 = _mm256_set1_epi8(15), r7 = _mm256_set1_epi8(17);
  const __m256i b = _mm256_set1_epi8(1);
#define HMOE_EIGHT(X) X::op(r0, b), X::op(r1, b), X::op(r2, b), X::op(r3, b), X::op(r4, b), X::op(r5, b), X::op(r6, b), X::op(r7, b)
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it) {
    HMOE_EIGHT(A);
    HMOE_EIGHT(B);
    HMOE_EIGHT(C);
    HMOE_EIGHT(D);
  }
#undef HMOE_EIGHT
  asm volatile("" : : "x"(r0), "x"(r1), "x"(r2), "x"(r3), "x"(r4), "x"(r5), "x"(r6), "x"(r7));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds per cycle: 32 dependent vpaddd on one register per iteration.
__attribute__((target("avx2"), noinline)) double clock_run(long iters) {
  __m256i r = _mm256_set1_epi8(3);
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it)
    for (int i = 0; i < 4; ++i)
      asm volatile(
          "vpaddd %0, %0, %0\n\tvpaddd %0, %0, %0\n\tvpaddd %0, %0, %0\n\tvpaddd %0, %0, %0\n\t"
          "vpaddd %0, %0, %0\n\tvpaddd %0, %0, %0\n\tvpaddd %0, %0, %0\n\tvpaddd %0, %0, %0"
          : "+x"(r));
  asm volatile("" : : "x"(r));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (32.0 * static_cast<double>(iters));
}

// Best of 5: seconds per 32-instruction iteration.
template <class A, class B, class C, class D>
double best(long iters) {
  double b = 1e30;
  for (int k = 0; k < 5; ++k) {
    const double t = run<A, B, C, D>(iters) / static_cast<double>(iters);
    if (t < b) b = t;
  }
  return b;
}

struct Row {
  const char* mix;
  double (*fn)(long);
};

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.05;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_simd_pipes [--seconds S]\n");
      return 2;
    }
  }
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("bench_simd_pipes: this CPU has no AVX2/FMA: nothing to measure\n");
    return 0;
  }
  // iterations for about `seconds` at ~8 cycles per iteration and ~3 GHz
  const long iters = std::max(1000L, static_cast<long>(seconds * 3e9 / 8));
  double cycle = 1e30;  // one dependent vpaddd per cycle
  for (int k = 0; k < 5; ++k) cycle = std::min(cycle, clock_run(iters));
  std::printf("# bench_simd_pipes: clock %.2f GHz (dependent vpaddd chain), best of 5, %ld iterations of 32 instructions\n\n", 1e-9 / cycle, iters);
  std::printf("| mix | instructions per cycle |\n|---|---|\n");
  const Row rows[] = {
      {"vpaddd", best<Add, Add, Add, Add>},
      {"vpmaddubsw", best<Maddubs, Maddubs, Maddubs, Maddubs>},
      {"vpmaddwd", best<Madd, Madd, Madd, Madd>},
      {"vpsignb", best<Sign, Sign, Sign, Sign>},
      {"vpblendvb", best<Blendv, Blendv, Blendv, Blendv>},
      {"vpshufb", best<Shufb, Shufb, Shufb, Shufb>},
      {"vpunpcklwd", best<Unpack, Unpack, Unpack, Unpack>},
      {"vpsrlw", best<Srlw, Srlw, Srlw, Srlw>},
      {"vpslld", best<Slld, Slld, Slld, Slld>},
      {"vpmovzxwd ymm, xmm", best<Pmovzx, Pmovzx, Pmovzx, Pmovzx>},
      {"vpmovsxbw ymm, xmm", best<Pmovsx, Pmovsx, Pmovsx, Pmovsx>},
      {"vcvtdq2ps", best<Cvt, Cvt, Cvt, Cvt>},
      {"vmulps (the FMA pipes)", best<Mul, Mul, Mul, Mul>},
      {"vbroadcastss from memory", best<Bcast, Bcast, Bcast, Bcast>},
      {"vpmaddubsw, vpsignb", best<Maddubs, Sign, Maddubs, Sign>},
      {"vpmaddubsw, vpblendvb", best<Maddubs, Blendv, Maddubs, Blendv>},
      {"vpmaddubsw, vpmaddwd", best<Maddubs, Madd, Maddubs, Madd>},
      {"vpsignb, vpmaddubsw, vpmaddwd, vpaddd (Q8_0 8-bit step)", best<Sign, Maddubs, Madd, Add>},
      {"vpmaddwd, vpaddd (Q8_0 int16 step)", best<Madd, Add, Madd, Add>},
      {"vpmaddwd, vmulps", best<Madd, Mul, Madd, Mul>},
      {"vpmaddwd, vcvtdq2ps", best<Madd, Cvt, Madd, Cvt>},
      {"vpmaddwd x3, vpunpcklwd", best<Madd, Madd, Madd, Unpack>},
      {"vpmaddubsw, vpshufb", best<Maddubs, Shufb, Maddubs, Shufb>},
      {"vpmaddubsw, vpsrlw", best<Maddubs, Srlw, Maddubs, Srlw>},
      {"vpmaddubsw, vpmovsxbw", best<Maddubs, Pmovsx, Maddubs, Pmovsx>},
      {"vmulps x3, vpmovzxwd (bf16 widening before)", best<Mul, Mul, Mul, Pmovzx>},
      {"vmulps x3, vpslld", best<Mul, Mul, Mul, Slld>},
      {"vmulps x3, vpunpcklwd (bf16 widening now)", best<Mul, Mul, Mul, Unpack>},
      {"vmulps x3, vbroadcastss from memory", best<Mul, Mul, Mul, Bcast>},
  };
  for (const Row& r : rows) std::printf("| %s | %.2f |\n", r.mix, cycle * 32.0 / r.fn(iters));
  return 0;
}
#else
int main() {
  std::printf("bench_simd_pipes: x86-64 only\n");
  return 0;
}
#endif
