# final13.sh cut to the device time session 13 had left (<= 300 s): the attention tests, v4's walks timed, then
# bench/jobs/k27b.sh part 4 for what time is left (the 48-layer Q8_0-expert file, 8k streamed under the pipelined
# kernel, 32k streamed; the 32k CPU-expert reference is skipped when the time is short).
# Run: carry [".device/f13"], `TOTAL=290 OUT=$OUT bash .device/f13/scripts/device run final13s:300`.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f13; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-290}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f13.tgz" -C "$O" . 2>/dev/null; }
here=$(dirname "${BASH_SOURCE[0]}")
for g in "$here/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
sum() { grep -E "ERROR|FATAL|FAILED|test cases:|assertions:|MISMATCH|worst" "$O/$1.log" | cut -c1-240 | head -${2:-30}; }
echo "== final13s start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard attn 60 $B test_gpu -tc='gpu attention*'
sum attn
guard dbench 45 $B bench_gpu_deltanet --reps 2 --kernels v4
grep -E "v4|layer|roof|walk" "$O/dbench.log" | head -30
mkdir -p /tmp/k27o
O=/tmp/k27o K27B_PART=4 LIMIT=$(($(rem) - 5)) bash "$here/k27b.sh"
tar czf "$OUTD/k27o.tgz" -C /tmp/k27o . 2>/dev/null
echo "== final13s done t=$((SECONDS - T0))"; pack
