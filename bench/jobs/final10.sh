# Lead's first job of session 10 (2026-12-07): issue 27's "auto within 5% of the best static placement" after the
# step's room was sized on its tokens (engine/layers/expert_stream.h expert_stream_step_room): test_gpu's streamed
# cases (make_expert_stream's room changed), then bench/jobs/k27b.sh part 3 (the 48-layer Q8_0-expert model at a
# 24 GiB cap: static r28 and auto with the cache off in the same call, -r 3, auto's 4096-token prefill in its own passes,
# and the 8k streamed prefill in 8192-token passes). Re-run after the stream shared the stack's scratch.
# Run: carry [".device/f8"], `OUT=$OUT bash .device/f8/scripts/device run final10:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f10; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-575}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f10.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final10 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard ts 90 $B test_gpu -tc='*stream*,*chunk*'
grep -E "ERROR|FATAL|FAILED|test cases:|assertions:" "$O/ts.log" | cut -c1-240 | head -20
mkdir -p /tmp/k27o
O=/tmp/k27o LIMIT=$(($(rem) - 10)) K27B_PART=3 K27B_BEST=28 K27B_REPS=3 bash "$(dirname "${BASH_SOURCE[0]}")/k27b.sh"
tar czf "$OUTD/k27o.tgz" -C /tmp/k27o . 2>/dev/null
echo "== final10 done t=$((SECONDS - T0))"; pack
