# Lead's first device job of session 13, <= 590 s:
#   A. test_gpu -tc='gpu attention*': the bf16-q reference and kernels 2/3 against kernel 1 (changed in session 12,
#      not yet run on a GPU);
#   A2. bench_gpu_deltanet --kernels v4 (v4's walk 1 and walk 2 timed alone, the layer against its roof);
#   B. bench/jobs/q3n48.sh (48-layer Qwen3-Next shape, IQ4_XS experts) with the time left, steps "cap cpu": the
#      CPU-expert rows of issue 25 and the 24 GiB cap row of issue 27 (never measured); Q3N_STEPS="cpu cap gpu"
#      adds the all-GPU rows again under the new defaults (pipelined GGUF prefill, attention kernel 3).
# F13_SHORT=1 (final13s.sh, the call that ran with 344 s left): A, A2, then bench/jobs/k27b.sh part 4 for the time
# left instead of B.
# Run: carry [".device/f13"], `OUT=$OUT bash .device/f13/scripts/device run final13:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f13; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-575}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f13.tgz" -C "$O" . 2>/dev/null; }
here=$(dirname "${BASH_SOURCE[0]}")
for g in "$here/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
sum() { grep -E "ERROR|FATAL|FAILED|test cases:|assertions:|MISMATCH|worst" "$O/$1.log" | cut -c1-240 | head -${2:-30}; }
echo "== final13 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard attn 90 $B test_gpu -tc='gpu attention*'
sum attn
guard fix 60 $B test_gpu -tc='*qwen3next*,*qwen3_next*'  # the Qwen3-Next fixture under v4's walk 2 (the default since 8b784f0)
sum fix
# v4's two walks timed alone at 32k (walk2, the 16-warp one, has not been recorded), the layer against its roof
guard dbench 50 $B bench_gpu_deltanet --reps 3 --kernels v4
grep -vE "^\s*$" "$O/dbench.log" | head -60
if [[ ${F13_SHORT:-0} == 1 ]]; then
  mkdir -p /tmp/k27o
  O=/tmp/k27o K27B_PART=4 LIMIT=$(($(rem) - 5)) bash "$here/k27b.sh"
  tar czf "$OUTD/k27o.tgz" -C /tmp/k27o . 2>/dev/null
else
  mkdir -p /tmp/q3o
  O=/tmp/q3o PACK_TAR="$OUTD/q3o.tgz" LIMIT=$(($(rem) - 5)) Q3N_STEPS="${Q3N_STEPS:-cap cpu}" bash "$here/q3n48.sh"
  tar czf "$OUTD/q3o.tgz" -C /tmp/q3o . 2>/dev/null
fi
echo "== final13 done t=$((SECONDS - T0))"; pack
