# Lead's third device call of session 9: issue 27's 24 GiB-cap job, part 2 (best static placement on the Zipf
# trace, deferral, 8k prefill streamed and with CPU experts, LRU, batch-8 plans), then the Qwen3-Next fixture
# under the v3 delta rule. On a machine that is no longer warm, part 2 writes the model again (K27B_BEST names the
# best static placement of part 1).
# Run: carry [".device/f8"], `K27B_BEST=R OUT=$OUT bash .device/f8/scripts/device run final8c:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; T0=$SECONDS
echo "== final8c start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
mkdir -p /tmp/k27o
O=/tmp/k27o LIMIT=470 K27B_PART=2 bash "$(dirname "${BASH_SOURCE[0]}")/k27b.sh"
tar czf "$OUTD/k27o.tgz" -C /tmp/k27o . 2>/dev/null
left=$((585 - (SECONDS - T0)))
if ((left > 30)); then
  timeout $left env HMOE_GPU_DELTANET_KERNEL=v3 $B test_gpu -tc='*qwen3next*,*qwen3_next*' >"$OUTD/next_v3.log" 2>&1
  echo "qwen3next v3 rc $?"; grep -E "placement |  miss:|ERROR|FAILED|test cases:|assertions:" "$OUTD/next_v3.log" | head -30
fi
echo "== final8c done t=$((SECONDS - T0))"
