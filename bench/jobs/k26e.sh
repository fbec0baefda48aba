# The 8-bit GGUF kernels on the device's Xeon (issue 26 CPU half, branch
# k26e): the row-interleaved tile kernels (numa/quant_gguf_q8_tiles.cpp) and
# the per-row kernels must give the scalar model's bits on this CPU too, and
# how fast each is at 16 threads against the vpdpbusd peak measured there.
#   1. test_numa's 8-bit GGUF cases (tiles / per-row / gemm_rows_q8 equal
#      the scalar model bit for bit at 1..17 tokens; the AMX-INT8 tiles on
#      the hardware (and emulated) equal them at 16..35 tokens; the reference
#      bound; threading; the expert engine) - 20 s;
#   2. bench_gguf_cpu --kernels --threads 16 --quick: per-row vs tiles (with
#      AMX-INT8 16-token blocks where present; last column: VNNI tiles
#      alone), Q4_K, Q5_K, Q6_K, Q8_0 on the expert and q_proj shapes,
#      1..512 tokens - 45 s;
#   3. bench_gguf_cpu --threads 16 --quick --no-attention --formats q4km
#      (the expert engine at batch 1, 64, 512) - 25 s;
#   4. if $SLICE_Q4KM is set: hmoe bench pp512 / tg64 on it, 16 threads - 25 s.
# Needs $B (a root packed with BUILD/bin/hmoe, BUILD/tests/test_numa and
# BUILD/bench/bench_gguf_cpu), $O or $OUT. At most about 120 s; every step
# has its own time limit and writes its log under $O as it goes.
set -u
O=${O:-${OUT:-/tmp/out}}; mkdir -p "$O"
T0=$SECONDS
step() {  # NAME LIMIT CMD...
  local name=$1 lim=$2; shift 2
  echo "== k26e $name (limit $lim s) $(date -u +%T) t=$((SECONDS - T0))"
  timeout "$lim" "$@" >"$O/k26e-$name.log" 2>&1
  echo "k26e $name rc $?"
  grep -E '^\||^#|test cases|assertions|ERROR|error' "$O/k26e-$name.log" | tail -60
}
grep -o -m1 -E 'avx512_vnni|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' '; echo "(cpu flags)"
step test_q8 20 $B test_numa -tc='*scalar model*,*AMX-INT8*,*gemm_rows_q8*,*gemm_q8*,*Q8Acts*,*GGUF experts*'
step kernels 45 $B bench_gguf_cpu --kernels --threads 16 --quick
step experts 25 $B bench_gguf_cpu --threads 16 --quick --no-attention --formats q4km
if [[ -n ${SLICE_Q4KM:-} && -f ${SLICE_Q4KM:-} ]]; then
  step slice 25 $B hmoe bench "$SLICE_Q4KM" -p 512 -n 64 --batch 1 -r 2 --device cpu --threads 16 --progress none
fi
echo "== k26e done t=$((SECONDS - T0))"
