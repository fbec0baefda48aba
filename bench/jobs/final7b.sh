# The short form of final7.sh for a call with little device time left: test_gpu's cases that the new defaults
# touch (expert cache and split decode, no longer skipped; low-bit streamed and split; zero-copy; Qwen3-Next under
# the v2 delta rule; GGUF streamed and the placements), one process, time-limited.
# Run: carry [".device/f7"], `TOTAL=170 OUT=$OUT bash .device/f7/scripts/device run final7b:180`, timeout 200.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f7; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-170}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f7.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final7b start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard tg 160 $B test_gpu -d -tc='*expert cache*,gpu gguf low-bit: s*,zero-copy*,*qwen3next*,*qwen3_next*,*five placements*,*streamed*,*GGUF*'
grep -E "ERROR|FATAL|FAILED|test cases:|assertions:" "$O/tg.log" | cut -c1-240 | head -30
grep -E "^[0-9.]+ s: " "$O/tg.log" | sort -rn | head -8; tail -2 "$O/tg.log" | cut -c1-200
echo "== final7b done t=$((SECONDS - T0))"; pack
