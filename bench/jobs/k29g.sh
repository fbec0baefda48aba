# Issue 26, all-GPU decode (branch k29g): the direct GGUF decode kernels
# (gpu/gguf_gemv_direct.cu) against the staged ones they replace, in one call.
#  1. bench_gpu_gguf --decode: per type (Q4_K, Q5_K, Q6_K, Q8_0) and
#     Qwen3-30B-A3B shape (lm_head, q/k/o projections, one expert's gate/up
#     and down, the top-8 MoE layer) at 1 and 8 tokens: staged and direct
#     side by side in one process (us, GB/s, % of the read probe, ratio);
#  2. test_gpu: the GGUF kernel tests (both kernel sets against the scalar
#     reference and each other; the GGUF model on the GPU against the CPU);
#  3. hmoe bench on the 8-layer Q4_K_M slice, all on the GPU, tg64 at batch 1
#     and 8 with --decode-breakdown (kernels per step, GB/s, per-layer
#     attention / feed-forward time): direct (the default), then staged
#     (HMOE_GPU_GGUF_DECODE_KERNEL=staged), same binary, same call.
# The slice (bench/jobs/slices.sh: slice_gguf + llama-quantize from the
# llama-cpu bundle, ~120 s, CPU only) is made in the background while 1 and
# 2 run. Needs $B (a root packed with bin/hmoe, bin/slice_gguf,
# tests/test_gpu, bench/bench_gpu_gguf) and $O or $OUT. <= 240 s.
set -u
O=${O:-${OUT:-/tmp/out}}; mkdir -p "$O"
T0=$SECONDS
t() { echo "t=$((SECONDS - T0))"; }
echo "== k29g start $(date -u +%T); $(nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null)"
( TYPES=Q4_K_M QUANT_SECS=${QUANT_SECS:-150} source bench/jobs/slices.sh >"$O/slices.txt" 2>&1 ) &
slices_pid=$!

echo "== bench_gpu_gguf --decode $(t)"
timeout 75 $B bench_gpu_gguf --decode --reps ${REPS:-10} >"$O/bench_gpu_gguf.txt" 2>&1
echo "bench_gpu_gguf rc $? $(t)"; cat "$O/bench_gpu_gguf.txt"

echo "== test_gpu GGUF kernels $(t)"
for f in test_gpu_gguf_native test_gpu_gguf; do
  timeout 45 $B test_gpu -sf="*$f.cpp" >"$O/tg-$f.log" 2>&1
  echo "$f rc $? $(t)"; grep -E "^\[doctest\] (test cases|assertions)|ERROR|FAILED|worst" "$O/tg-$f.log" | head -12
done

echo "== waiting for the slice $(t)"
wait $slices_pid; cat "$O/slices.txt"
SLICE=${SLICE_Q4KM:-/tmp/sbs/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf}
bench() {  # NAME LIMIT [VAR=VALUE...]
  local name=$1 limit=$2; shift 2
  [[ -f $SLICE ]] || { echo "$name: no slice"; return; }
  local left=$((235 - (SECONDS - T0)))
  ((left > 15)) || { echo "$name: no time ($left s left)"; return; }
  ((limit < left)) || limit=$left
  echo "== hmoe bench $name $* $(t) (limit $limit s)"
  env "$@" timeout "$limit" $B hmoe bench "$SLICE" -p 0 -n 64 -r 3 --batch 1,8 --gpu-resident-moe-layers all --progress none --decode-breakdown \
    >"$O/hmoe-$name.md" 2>"$O/hmoe-$name.err"
  echo "hmoe $name rc $? $(t)"; cat "$O/hmoe-$name.md"; tail -3 "$O/hmoe-$name.err"
}
bench direct 45
bench staged 40 HMOE_GPU_GGUF_DECODE_KERNEL=staged
# Time left: the GGUF kernel tests under compute-sanitizer (out-of-bounds or
# misaligned global / shared accesses of either kernel set).
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
left=$((236 - (SECONDS - T0)))
if [[ -x $cs ]] && ((left > 25)); then
  echo "== compute-sanitizer memcheck, test_gpu_gguf_native.cpp $(t) (limit $left s)"
  B_DIR=$(dirname "$B")
  timeout $left env LD_LIBRARY_PATH="$B_DIR/lib:${CUDA_HOME:-/usr/local/cuda}/lib64" "$cs" --tool memcheck --print-limit 20 "$B_DIR/bin/test_gpu" -sf='*test_gpu_gguf_native.cpp' \
    -tc='gpu gguf_gemv matches*,gpu gguf_moe_experts*' >"$O/memcheck.log" 2>&1
  echo "memcheck rc $? $(t)"; grep -E "ERROR SUMMARY|Invalid|test cases|assertions" "$O/memcheck.log" | head -12
fi
echo "== k29g done $(t)"
