# k32d device job (issue 26, hybrid decode >= 1.5x llama.cpp -ot exps=CPU):
# the zero-copy hand-off (--gpu-handoff zero-copy, engine/runtime/
# zero_copy_handoff.h) against the copy hand-off.
#   1. the Q4_K_M 8-layer slice (bench/jobs/slices.sh; reused if made before)
#   2. test_gpu's zero-copy cases (kernels; bit-identical logits vs copy on
#      the Q8_0 GGUF fixture, tiny-qwen3moe and tiny-deepseekv3 safetensors at
#      batch 1 and 3; a throwing CPU expert step and withheld releases fail
#      cleanly within the time-out), then the copy path's overlap cases
#   3. bench_gpu_handoff: the hand-off's own cost per layer (no CPU work),
#      copy against zero-copy, at 1, 8 and 64 tokens
#   4. hmoe bench SLICE -p 0 -n 64 -r 3 --batch 1,8 --gpu-resident-moe-layers
#      none under copy, zero-copy, copy, zero-copy (two alternations: the
#      tok/s table and the hand-off lines saying what each column holds)
# Every step runs under guard (bench/jobs/guard.sh); total <= TOTAL (420 s).
# Needs (CUDA build, sm_90): hmoe, test_gpu, bench_gpu_handoff, slice_gguf; the llama-cpu bundle
# (llama-quantize) as for final4.sh. Logs under /tmp/k32d, tarred to $OUT/k32d.tgz.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/k32d; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-420}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/k32d.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== k32d start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader) $(nproc) cpus"
W=/tmp/sbs; mkdir -p $W; SLICE=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
[[ -s $SLICE ]] || guard slices 90 env W=$W TYPES=Q4_K_M QUANT_SECS=70 bash -c 'source bench/jobs/slices.sh'
tail -2 $O/slices.log 2>/dev/null; [[ -s $SLICE ]] || echo "NO SLICE"
guard tests 120 $B test_gpu -tc='zero-copy*'
grep -E "zero-copy steps|throwing|withheld|ERROR|FAILED|SKIP|test cases:|assertions:" "$O/tests.log" | head -24
guard overlap 60 $B test_gpu -sf='*test_gpu_overlap.cpp'
grep -E "ERROR|FAILED|test cases:|assertions:" "$O/overlap.log" | head -8
guard handoff 40 $B bench_gpu_handoff
cat "$O/handoff.log"
i=0
for h in copy zero-copy copy zero-copy; do
  n=bench-$h-$((++i))
  guard $n 60 $B hmoe bench "$SLICE" -p 0 -n 64 -r 3 --batch 1,8 --gpu-resident-moe-layers none --gpu-handoff $h --progress none
  grep -E "^\| tg|hand-off|Error|error" "$O/$n.log" | head -8
done
echo "== k32d done t=$((SECONDS - T0))"; pack
