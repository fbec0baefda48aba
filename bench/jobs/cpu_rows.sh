# Issue 26's CPU-only rows for the final device call: hmoe on the 8-layer
# Qwen3-30B-A3B slice files (Q4_K_M and Q8_0, made by the call with
# slice_gguf + llama-quantize) at 16 threads, `--device cpu`, next to the
# CPU-only llama.cpp the call builds. Inputs (environment): B (runs a packed
# binary: `$B hmoe ...`), SLICE_Q4KM and SLICE_Q8_0 (the files), LLAMA_CPU
# (llama.cpp build; llama-bench in $LLAMA_CPU/bin), OUT (results, written as
# they come). Every step has its own time limit and the job stops starting
# new ones after BUDGET seconds (default 150), so one slow step leaves the
# others their time. Prints one markdown table per step (hmoe's own).
#   1. test_numa's AMX cases (hardware tiles against the scalar reference;
#      skipped with a message when test_numa is not packed);
#   2. per file: pp512, pp4096, tg64 (context 0-64) -r 2, default settings;
#   3. per file: tg64 after a 4096-token context (decode flat with context:
#      compare with tg64 of step 2; issue 26: within 15%);
#   4. per file: pp512, pp4096 (-r 1) with AMX-BF16 prefill on (HMOE_CPU_AMX_MIN_TOKENS=8);
#   5. llama-bench tg64 at depth 4096 (-d 4096), if time is left, for the
#      decode-at-4096 ratio (the side-by-side cpu row has llama.cpp's pp/tg at depth 0);
#   6. bench_gguf_cpu --prefill-only (VNNI vs AMX kernels), if packed and time is left.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
BUDGET=${BUDGET:-150}
T=16
left() { echo $((BUDGET - SECONDS)); }
step() {  # NAME LIMIT CMD...: runs CMD under min(LIMIT, time left), output to $O/NAME.log and the tail here
  local name=$1 lim=$2; shift 2
  local l; l=$(left); ((l < lim)) && lim=$l
  if ((lim < 8)); then echo "== $name: skipped (t=$SECONDS of $BUDGET s)"; return; fi
  echo "== $name (limit $lim s, t=$SECONDS) $(date -u +%T)"
  timeout "$lim" "$@" >"$O/$name.log" 2>&1; local rc=$?
  grep -E '^\||test cases|assertions|AMX|amx|skipped|rc|error|Error' "$O/$name.log" | tail -16
  ((rc != 0)) && echo "$name: rc $rc"
}
bin_dir=$(dirname "$B")/bin
if [[ -x $bin_dir/test_numa ]]; then
  step amx_test 25 "$B" test_numa -tc='*amx*,*AMX*'
else
  echo "== amx_test: test_numa not packed (scripts/device pack ... BUILD/tests/test_numa runs it)"
fi
grep -o -m1 -E 'amx_(bf16|tile|int8)' /proc/cpuinfo | sort -u | tr '\n' ' '; echo "(cpu flags)"
cpu=(--device cpu --threads $T --progress none)
for f in "$SLICE_Q4KM" "$SLICE_Q8_0"; do
  n=$(basename "$f" .gguf)
  step "$n-rows" 55 "$B" hmoe bench "$f" -p 512,4096 -n 64 --batch 1 -r 2 "${cpu[@]}"
done
for f in "$SLICE_Q4KM" "$SLICE_Q8_0"; do
  n=$(basename "$f" .gguf)
  step "$n-tg-d4096" 25 "$B" hmoe bench "$f" -p 0 -n 64 -d 4096 --batch 1 -r 2 "${cpu[@]}"
done
for f in "$SLICE_Q4KM" "$SLICE_Q8_0"; do
  n=$(basename "$f" .gguf)
  HMOE_CPU_AMX_MIN_TOKENS=8 step "$n-amx" 25 "$B" hmoe bench "$f" -p 512,4096 -n 0 -r 1 "${cpu[@]}"
done
if [[ -x ${LLAMA_CPU:-}/bin/llama-bench ]]; then
  for f in "$SLICE_Q4KM" "$SLICE_Q8_0"; do
    n=$(basename "$f" .gguf)
    step "$n-llama-tg-d4096" 30 "$LLAMA_CPU/bin/llama-bench" -m "$f" -t $T -ngl 0 -p 0 -n 64 -d 4096 -r 2
  done
fi
if [[ -x $bin_dir/bench_gguf_cpu ]]; then  # kernel view: VNNI vs AMX-BF16 prefill products, attention kernels
  step prefill-kernels 30 "$B" bench_gguf_cpu --threads $T --quick --prefill-only
fi
echo "== cpu_rows done t=$SECONDS"
