# Lead's combined device job of 2026-12-07 (stage = main + k32b + k32c + k32d [+ k32a]), in priority order,
# every step time-limited (bench/jobs/guard.sh); logs under /tmp/f5, tarred to $OUT/f5.tgz after each step.
#   A. k32c: Qwen3-Next fixture on the GPU, every placement (issue 25: 217/217 clear rows all-GPU and mixed)
#   B. k32b: Gated DeltaNet kernel cases, v1 and v2
#   (the 8-layer Q4_K_M slice is written meanwhile: bench/jobs/slices.sh, CPU)
#   C. k32d: zero-copy hand-off tests (bit-identical logits, failures do not hang)
#   D. hybrid Q4_K_M slice (experts on the CPU, 16 threads), pp4096 + tg64 batch 1: pinned residence off / copy
#      (k31c), hand-off copy / zero-copy (k32d)
#   E. k32b: bench_gpu_deltanet (delta rule and whole linear-attention layer at 4k / 32k against the roof)
#   F. bench_gpu_qwen3next: Qwen3-Next-80B-A3B shape (8 of 48 layers), 4k / 32k, all-GPU and experts on the CPU
#   G. k32a: bench_gguf_lowbit at 16 threads on the Xeon (IQ1 v5 repack)
#   H. the Qwen3-Next fixture under the v2 delta rule, time allowing
# Run: carry [".device/f5"], `TOTAL=540 OUT=$OUT bash .device/f5/scripts/device run final5:560`, timeout 590.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f5; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-540}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f5.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final5 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader) $(grep MemAvailable /proc/meminfo)"
W=/tmp/sbs; mkdir -p $W; SLICE=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
( env W=$W TYPES=Q4_K_M QUANT_SECS=80 bash -c 'source bench/jobs/slices.sh' >"$O/slices.log" 2>&1 ) &
slices_pid=$!
guard next 85 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
grep -E "placement |  miss:|activation pair|ERROR|FAILED|test cases:|assertions:" "$O/next.log" | head -40
guard dn 45 $B test_gpu -tc='gated deltanet*'
dn_rc=$rc
grep -E "delta-rule output|head dims 128|v2 against v1|130 \+ 170|ERROR|FAILED|test cases:|assertions:" "$O/dn.log" | head -24
wait $slices_pid; tail -3 "$O/slices.log"; [[ -s $SLICE ]] || echo "NO SLICE"
guard zc 40 $B test_gpu -tc='zero-copy*'
zc_rc=$rc
grep -E "differing|zero-copy|ERROR|FAILED|test cases:|assertions:" "$O/zc.log" | head -20
for v in "off copy" "copy copy" "copy zero-copy"; do
  set -- $v; [[ $2 == zero-copy && $zc_rc != 0 ]] && { echo "skip zero-copy bench: tests rc $zc_rc"; continue; }
  guard "hyb-$1-$2" 40 $B hmoe bench "$SLICE" -p 4096 -n 64 -r 2 --batch 1 --gpu-resident-moe-layers none --gpu-pin-host-experts $1 --gpu-handoff $2 --progress lines
  grep -E "residence|host experts|loaded in|streamed|hand-off|^\| [pt]|rror" "$O/hyb-$1-$2.log" | head -14
done
k=v1; ((dn_rc == 0)) && k=v2
guard dbench 90 $B bench_gpu_deltanet --reps 3
grep -vE "^\s*$" "$O/dbench.log" | head -60
guard qnext 120 $B bench_gpu_qwen3next --layers 8 --contexts 4096,32768 --chunk 4096 --steps 32 --skip-bf16 --deltanet-kernel $k
head -60 "$O/qnext.log"
guard lowbit 35 $B bench_gguf_lowbit --threads 16 --quick --experts 16 --compare-v2
grep -E "IQ|Q2_K|Q3_K|MXFP4|probe" "$O/lowbit.log" | head -24
((dn_rc == 0)) && { guard next_v2 60 env HMOE_GPU_DELTANET_KERNEL=v2 $B test_gpu -tc='*qwen3next*,*qwen3_next*';
  grep -E "placement |  miss:|ERROR|FAILED|test cases:|assertions:" "$O/next_v2.log" | head -20; }
echo "== final5 done t=$((SECONDS - T0))"; pack
