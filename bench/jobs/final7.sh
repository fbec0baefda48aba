# Lead's verification call of 2026-12-07 after switching defaults (gpu_deltanet_kernel v2, gpu_pin_host_experts copy,
# gpu_expert_cache auto; the expert cache's GPU tests no longer skipped):
#   T. test_gpu whole under the new defaults (one process, time-limited; failures listed)
#   Q. bench_gpu_qwen3next at 4k / 32k with the copy residence (experts on the CPU now stream pinned)
# Logs under /tmp/f7, tarred to $OUT/f7.tgz after each step.
# Run: carry [".device/f7"], `TOTAL=400 OUT=$OUT bash .device/f7/scripts/device run final7:420`, timeout 440.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f7; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-400}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f7.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final7 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard tg 230 $B test_gpu -d
grep -E "ERROR|FATAL|FAILED|test cases:|assertions:" "$O/tg.log" | cut -c1-240 | head -40
grep -E "^[0-9.]+ s: " "$O/tg.log" | sort -rn | head -12; tail -3 "$O/tg.log" | cut -c1-200
guard qnext 140 $B bench_gpu_qwen3next --layers 8 --contexts 4096,32768 --chunk 4096 --steps 32 --skip-bf16
grep -E "^\||limits|streamed|GPU weights" "$O/qnext.log" | cut -c1-400 | head -40
echo "== final7 done t=$((SECONDS - T0))"; pack
