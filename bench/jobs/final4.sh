# Lead's combined device job of 2026-12-06 ~23:10 (main after k31a/k31b/k31c/k31d), in priority order, each step
# time-limited; logs under /tmp/fin, tarred to $OUT/fin.tgz after every step (the fetch drops files past a count).
#   1. the Q4_K_M 8-layer slice (bench/jobs/slices.sh)
#   2. k31c: hybrid slice under --gpu-pin-host-experts copy and off (load/registration time, streamed GB/s, tok/s)
#   3. k31d: all-GPU tg64 with k31d's default launches (--decode-kernels table) and with main's (--gpu-decode-fuse none);
#      test_gpu_decode_step.cpp and test_gpu_gguf_native.cpp
#   4. k31a: test_gpu attention cases (head_dim 256/160) and the Qwen3-Next cases
#   5. k31b: bench_gguf_lowbit --threads 16 on the Xeon
#   6. k31a: bench_gpu_qwen3next, real shapes, 8 layers, context 4096 (then 32768 if time is left)
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/fin; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-440}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/fin.tgz" -C "$O" . 2>/dev/null; }
# The step runner: bench/jobs/guard.sh (in a device root: beside this job, or under bench/jobs/).
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final4 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader) $(grep MemAvailable /proc/meminfo)"
W=/tmp/sbs; mkdir -p $W; SLICE=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
[[ -s $SLICE ]] || guard slices 80 env W=$W TYPES=Q4_K_M QUANT_SECS=70 bash -c 'source bench/jobs/slices.sh'
tail -2 $O/slices.log 2>/dev/null; [[ -s $SLICE ]] || echo "NO SLICE"
for res in copy off; do
  guard "res-$res" 40 $B hmoe bench "$SLICE" -p 512,4096 -n 32 -r 2 --gpu-resident-moe-layers none --gpu-pin-host-experts $res --progress lines
  grep -E "residence|host experts|loaded in|streamed experts|notice|^\| [pt]|Error|error" "$O/res-$res.log" | head -14
done
guard dec-k31d 45 $B hmoe bench "$SLICE" -p 0 -n 64 -r 3 --batch 1,8 --gpu-resident-moe-layers all --progress none --decode-kernels
grep -E "^\| tg|^\| part|^\| (attention|feed|tail|embed|step|total)" "$O/dec-k31d.log" | head -24
guard dec-main 30 $B hmoe bench "$SLICE" -p 0 -n 64 -r 3 --batch 1,8 --gpu-resident-moe-layers all --progress none --gpu-decode-fuse none
grep -E "^\| tg" "$O/dec-main.log"
for f in test_gpu_decode_step test_gpu_gguf_native; do
  guard "tg-$f" 40 $B test_gpu -sf="*$f.cpp"; grep -E "^\[doctest\] (test cases|assertions)|ERROR|FAILED" "$O/tg-$f.log" | head -8
done
guard attn 45 $B test_gpu -tc='*qk_norm_rope*,*qkv_norm_rope_store*,gpu attention*,*norm_rope_store_attention*,gated attention kernels*,*tensor-core tiles*'
grep -E "hd [0-9]+ |ERROR|FAILED|test cases:|assertions:" "$O/attn.log" | head -30
guard next 70 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
grep -E "placement |  miss:|relative L2|ERROR|FAILED|test cases:|assertions:" "$O/next.log" | head -24
guard lowbit 30 $B bench_gguf_lowbit --threads 16 --quick --experts 16 --compare-v2
grep -E "IQ|Q2_K|Q3_K|MXFP4|probe" "$O/lowbit.log" | head -30
guard next_bench 120 $B bench_gpu_qwen3next --layers 8 --contexts 4096,32768 --chunk 4096 --steps 32 --skip-bf16
head -50 "$O/next_bench.log" 2>/dev/null
echo "== final4 done t=$((SECONDS - T0))"; pack
