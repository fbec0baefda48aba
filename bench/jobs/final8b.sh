# Lead's second device call of session 9: issue 28's GPU low-bit GB/s rows (never run before), then issue 27's
# 24 GiB-cap job, part 1 (model file, plans, static sweep, auto, auto + cache on uniform and Zipf routing).
# Needs a root packed with hmoe, slice_gguf and bench_gpu_gguf_lowbit.
# Run: carry [".device/f8"], `TOTAL=575 OUT=$OUT bash .device/f8/scripts/device run final8b:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; T0=$SECONDS
echo "== final8b start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader) $(grep MemAvailable /proc/meminfo)"
timeout 70 $B bench_gpu_gguf_lowbit --reps 10 >"$OUTD/gpu_lowbit.log" 2>&1; echo "bench_gpu_gguf_lowbit rc $? t=$((SECONDS - T0))"
tail -60 "$OUTD/gpu_lowbit.log"
mkdir -p /tmp/k27o
O=/tmp/k27o LIMIT=$((${TOTAL:-575} - (SECONDS - T0))) K27B_PART=1 bash "$(dirname "${BASH_SOURCE[0]}")/k27b.sh"
tar czf "$OUTD/k27o.tgz" -C /tmp/k27o . 2>/dev/null
echo "== final8b done t=$((SECONDS - T0))"
