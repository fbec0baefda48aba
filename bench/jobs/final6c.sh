# Lead's follow-up device call after final6 (same warm machine when possible: reuses /tmp/sbs's llama.cpp build):
#   H. the Qwen3-Next fixture under the v2 delta rule
#   R. the copy residence's and the GPU expert cache's tests (the cache's first run hung under in-place pinning)
#   K. k28b: DeepSeek-V3 slice (IQ2_XXS/Q2_K experts, rest Q4_K_M) vs llama.cpp -ngl 99 -ot exps=CPU, copy residence
#      (llama.cpp built here if the machine is fresh: about 200 s)
# Run: carry [".device/f6"], `TOTAL=575 OUT=$OUT bash .device/f6/scripts/device run final6c:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f6c; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-575}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f6c.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final6c start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
W=/tmp/sbs
for j in "$(dirname "${BASH_SOURCE[0]}")/llama_cuda.sh" bench/jobs/llama_cuda.sh; do [[ -f $j ]] && { source "$j"; break; }; done
guard next_v2 70 env HMOE_GPU_DELTANET_KERNEL=v2 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
grep -E "placement |  miss:|ERROR|FAILED|test cases:|assertions:" "$O/next_v2.log" | head -20
guard res 40 $B test_gpu -tc='*copy residence*,*GGUF block types streamed*'
grep -E "registered in|residence|off vs copy|ERROR|FAILED|test cases:|assertions:" "$O/res.log" | head -20
guard cache 45 env HMOE_GPU_PIN_HOST_EXPERTS=copy $B test_gpu -tc='*expert cache*,gpu gguf low-bit*'
cache_rc=$rc
grep -E "hit|ERROR|FAILED|test cases:|assertions:" "$O/cache.log" | head -20
[[ -n $build_pid ]] && { wait $build_pid; echo "llama build rc $? t=$((SECONDS - T0))"; tail -2 "$O/llama-cuda.log"; }
r=$(rem); mkdir -p "$O/k28b"
guard k28b $((r - 5)) env HMOE_GPU_PIN_HOST_EXPERTS=copy LLAMA_CUDA=$L LQ=$L O=$O/k28b bash .device/jobs/k28b.sh
tail -24 "$O/k28b.log"
q=/tmp/k28b/ds3-slice-4L-Q4_K_M-iq2_xxs-q2_k.gguf
if [[ -s $q && $cache_rc == 0 ]]; then
  guard k28b-split 60 $B hmoe bench "$q" -p 0 -n 64 -r 2 --batch 1 --threads 16 --gpu-resident-moe-layers none --gpu-pin-host-experts copy \
    --gpu-expert-cache 2GiB --progress none
  grep -E "split|cache|^\| [pt]|rror" "$O/k28b-split.log" | head -10
fi
echo "== final6c done t=$((SECONDS - T0))"; pack
