# Lead's second device job of session 13 (on the machine final13 warmed, or a fresh one), <= 590 s: issue 27's
# streamed prefill under the new default GGUF prefill kernel (pipelined): bench/jobs/k27b.sh part 4 (the 48-layer
# Q8_0-expert model at a 24 GiB cap: 8k streamed, 32k streamed, 32k on the CPU experts). Frees final13's
# Qwen3-Next file from /dev/shm first (both do not fit).
# Run: carry [".device/f13"], `OUT=$OUT bash .device/f13/scripts/device run final13b:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; mkdir -p "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-575}
here=$(dirname "${BASH_SOURCE[0]}")
echo "== final13b start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
rm -rf /dev/shm/q3n48; df -h /dev/shm | tail -1
mkdir -p /tmp/k27o
O=/tmp/k27o K27B_PART=4 LIMIT=$((TOTAL - (SECONDS - T0) - 5)) bash "$here/k27b.sh"
tar czf "$OUTD/k27o.tgz" -C /tmp/k27o . 2>/dev/null
echo "== final13b done t=$((SECONDS - T0))"
