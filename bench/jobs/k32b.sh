# k32b (issue 25: the v2 chunked delta rule of the Gated DeltaNet layers on the GPU), <= 300 s in all.
# Pack (from the k32b tree, an sm_90 build-gpu):
#   DEVICE_ROOT=/work/main/.device/k32b scripts/device pack build-gpu build-gpu/tests/test_gpu \
#     build-gpu/bench/bench_gpu_deltanet build-gpu/bench/bench_gpu_qwen3next
#   cp bench/jobs/k32b.sh bench/jobs/guard.sh /work/main/.device/k32b/.device/jobs/
# Run: carry [".device/k32b"], command `OUT=$OUT bash .device/k32b/scripts/device run k32b:300`.
# Logs under $OUT/k32b (and $OUT/k32b.tgz, re-packed after every step).
# Must show:
# 1. dn: test_gpu's two Gated DeltaNet kernel cases pass with v1 and v2: the small shape (dk 32, dv 48: a
#    full and a partial 32-column slice; 70/1/5-token sequences, chunks of 16 and 64, chunked and recurrent
#    mixed) and the new case at head dims 128 (sequences of 1, 63, 64, 65, 300 and 2 tokens, fresh and
#    continued states, chunks 64/32/16, the 300-token sequence as 130 + 170 tokens), against the double
#    reference (1e-4 abs + 1e-3 rel) and v2 against v1 (1e-5 + 1e-4); the MESSAGE lines give each ratio.
# 2. bench: bench_gpu_deltanet at 4096 and 32768 tokens of one sequence, steps of 2048 (the engine's
#    default) and one step: the v2-vs-v1 line at 4096 tokens (no MISMATCH), then per step size the
#    delta rule v1 and v2 (us, TFLOP/s, GB/s, % of roof) and the whole layer (in_proj + conv/gates +
#    delta rule + gated norm + out_proj, precise and bf16) with v1 and v2 against the roof
#    max(FLOP / measured cuBLAS bf16, bytes / measured read bandwidth). Issue 25's bar: the layer at
#    32768 with v2 at >= 50 % of roof. If the run with both kernels fails, bench_v1 has v1 alone.
# 3. next_v1 / next_v2: test_gpu's Qwen3-Next cases (tiny fixture against the transformers reference,
#    chunked prefill = one piece, two sequences in a batch, state reuse, GGUF) with the default kernel
#    and with HMOE_GPU_DELTANET_KERNEL=v2: both pass.
# 4. race / mem (only if step 1 failed): compute-sanitizer racecheck and memcheck on the small-shape case.
# 5. qn_v2 / qn_v1 (time allowing): bench_gpu_qwen3next, 8 real-shape layers, all-GPU precise, 32k prompt in
#    4096-token chunks with --deltanet-kernel v2 and v1: the linear-attention layers' share line.
set -u
OUTD=${OUT:-/tmp/out}; O=$OUTD/k32b; mkdir -p "$O"; T0=$SECONDS; TOTAL=${TOTAL:-295}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/k32b.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== k32b start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard dn 60 $B test_gpu -tc='gated deltanet*'
dn_rc=$rc
grep -E "delta-rule output|head dims 128|v2 against v1|130 \+ 170|ERROR|FAILED|test cases:|assertions:" "$O/dn.log" | head -40
guard bench 90 $B bench_gpu_deltanet --reps 5
bench_rc=$rc
cat "$O/bench.log" | head -70
if ((bench_rc != 0)); then
  guard bench_v1 45 $B bench_gpu_deltanet --reps 3 --kernels v1
  cat "$O/bench_v1.log" | head -50
fi
guard next_v1 45 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
grep -E "placement |  miss:|relative L2|ERROR|FAILED|test cases:|assertions:" "$O/next_v1.log" | head -20
guard next_v2 45 env HMOE_GPU_DELTANET_KERNEL=v2 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
grep -E "placement |  miss:|relative L2|ERROR|FAILED|test cases:|assertions:" "$O/next_v2.log" | head -20
if ((dn_rc != 0)); then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [[ -n $CS ]]; then
    guard race 40 "$CS" --tool racecheck --target-processes all $B test_gpu -tc='gated deltanet kernels match*'
    grep -E "RACE|Race|hazard|ERROR SUMMARY|test cases:" "$O/race.log" | head -20
    guard mem 40 "$CS" --tool memcheck --target-processes all $B test_gpu -tc='gated deltanet*'
    grep -E "Invalid|out of bounds|misaligned|ERROR SUMMARY|test cases:" "$O/mem.log" | head -20
  fi
fi
for k in v2 v1; do
  ((bench_rc != 0)) && [[ $k == v2 ]] && continue
  guard qn_$k 110 $B bench_gpu_qwen3next --layers 8 --contexts 32768 --chunk 4096 --steps 4 --skip-bf16 --skip-cpu --deltanet-kernel $k
  grep -iE "linear|prefill|tok/s|Error|error" "$O/qn_$k.log" | head -16
done
echo "== k32b done t=$((SECONDS - T0))"; pack
