# Lead's device job of session 15, <= 590 s, re-runnable whole: a second call on the warm machine skips what the
# first finished (markers in /tmp/f14, the Qwen3-Next file kept in /dev/shm, q3n48's finished runs kept in /tmp/q3o).
#   A. test_gpu -tc='gpu attention*' (the bf16-P tolerance, not yet run on a GPU) and the Qwen3-Next fixture under
#      v4's walk 2 (the default since 07 19:33);
#   A2. bench_gpu_deltanet --kernels v4 (walk 2 timed alone, the layer against its roof);
#   B. bench/jobs/q3n48.sh (48-layer Qwen3-Next shape, IQ4_XS experts), steps Q3N_STEPS (default "cap sweep1
#      sweep2 cpu"): issue 27's rows at the 24 GiB cap on this shape (auto, static sweep, Zipf trace, expert
#      cache, 8k CPU-expert prefill against the streamed one), then issue 25's CPU-expert rows.
# Run: carry [".device/f14"], `TOTAL=575 OUT=$OUT bash .device/f14/scripts/device run final14:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f14; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-575}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f14.tgz" -C "$O" . 2>/dev/null; }
here=$(dirname "${BASH_SOURCE[0]}")
for g in "$here/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
sum() { grep -E "ERROR|FATAL|FAILED|test cases:|assertions:|MISMATCH|worst" "$O/$1.log" | cut -c1-240 | head -${2:-30}; }
once() {  # NAME SECS CMD...: guard, unless an earlier call on this machine finished NAME
  local name=$1
  if [[ -f $O/$name.done ]]; then echo "$name: done in an earlier call"; return; fi
  guard "$@"
  ((rc != 124)) && touch "$O/$name.done"
  sum "$name"
}
echo "== final14 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
once attn 90 $B test_gpu -tc='gpu attention*'
once fix 60 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
if [[ ! -f $O/dbench.done ]]; then
  guard dbench 50 $B bench_gpu_deltanet --reps 3 --kernels v4
  ((rc != 124)) && touch "$O/dbench.done"
  grep -vE "^\s*$" "$O/dbench.log" | head -60
fi
mkdir -p /tmp/q3o
O=/tmp/q3o PACK_TAR="$OUTD/q3o.tgz" LIMIT=$(($(rem) - 5)) Q3N_STEPS="${Q3N_STEPS:-cap sweep1 sweep2 cpu}" bash "$here/q3n48.sh"
tar czf "$OUTD/q3o.tgz" -C /tmp/q3o . 2>/dev/null
echo "== final14 done t=$((SECONDS - T0))"; pack
