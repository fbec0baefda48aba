# The next device call after session 9: the three test_gpu cases fixed after final8.sh's run (their expectations,
# and the routing trace under split decode), then issue 27's 24 GiB-cap job, part 2 (auto + cache on the model's
# own routing, deferral, 8k prefill streamed and with CPU experts, LRU, batch-8 plans). On a machine that is not
# warm, part 2 writes the model again (K27B_BEST=28 names part 1's best static placement, measured 07 07:43).
# Run: carry [".device/f8"], `K27B_BEST=R OUT=$OUT bash .device/f8/scripts/device run final8c:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; T0=$SECONDS
echo "== final8c start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 100 $B test_gpu -tc='*split decode and the GPU expert cache*,*equal the simulator*,GGUF decode on the GPU*' >"$OUTD/fixed.log" 2>&1
echo "fixed cases rc $?"; grep -E "MESSAGE|ERROR|FAILED|test cases:|assertions:" "$OUTD/fixed.log" | cut -c1-260 | head -40
mkdir -p /tmp/k27o
O=/tmp/k27o LIMIT=$((560 - (SECONDS - T0))) K27B_PART=2 bash "$(dirname "${BASH_SOURCE[0]}")/k27b.sh"
tar czf "$OUTD/k27o.tgz" -C /tmp/k27o . 2>/dev/null
echo "== final8c done t=$((SECONDS - T0))"
