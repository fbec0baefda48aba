# Lead's first device call of 2026-12-07 (session 8): issue 25's GPU must-shows and issue 28's Xeon low-bit rates,
# every step time-limited (bench/jobs/guard.sh); logs under /tmp/f6a, tarred to $OUT/f6a.tgz after each step.
#   A. k32c: Qwen3-Next fixture on the GPU, every placement (217/217 clear rows all-GPU and mixed required)
#   B. k32b: Gated DeltaNet kernel cases, v1 and v2 against the double reference
#   E. bench_gpu_deltanet (delta rule and the whole linear-attention layer at 4k / 32k against the roof)
#   F. bench_gpu_qwen3next: Qwen3-Next-80B-A3B shape (8 of 48 layers), 4k / 32k, all-GPU and experts on the CPU
#   G. k32a: bench_gguf_lowbit at 16 threads on the Xeon (IQ1 v5 repack, IQ2/IQ3)
#   H. the Qwen3-Next fixture under the v2 delta rule
# Run: carry [".device/f6"], `TOTAL=480 OUT=$OUT bash .device/f6/scripts/device run final6a:500`, timeout 560.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f6a; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-480}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f6a.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final6a start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader) $(grep MemAvailable /proc/meminfo)"
guard next 85 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
grep -E "placement |  miss:|activation pair|ERROR|FAILED|test cases:|assertions:" "$O/next.log" | head -40
guard dn 45 $B test_gpu -tc='gated deltanet*'
dn_rc=$rc
grep -E "delta-rule output|head dims 128|v2 against v1|130 \+ 170|ERROR|FAILED|test cases:|assertions:" "$O/dn.log" | head -24
k=v1; ((dn_rc == 0)) && k=v2
guard dbench 80 $B bench_gpu_deltanet --reps 3
grep -vE "^\s*$" "$O/dbench.log" | head -60
guard qnext 130 $B bench_gpu_qwen3next --layers 8 --contexts 4096,32768 --chunk 4096 --steps 32 --skip-bf16 --deltanet-kernel $k
head -70 "$O/qnext.log"
guard lowbit 40 $B bench_gguf_lowbit --threads 16 --quick --experts 16 --compare-v2
grep -E "IQ|Q2_K|Q3_K|MXFP4|probe" "$O/lowbit.log" | head -30
((dn_rc == 0)) && { guard next_v2 70 env HMOE_GPU_DELTANET_KERNEL=v2 $B test_gpu -tc='*qwen3next*,*qwen3_next*';
  grep -E "placement |  miss:|ERROR|FAILED|test cases:|assertions:" "$O/next_v2.log" | head -20; }
echo "== final6a done t=$((SECONDS - T0))"; pack
