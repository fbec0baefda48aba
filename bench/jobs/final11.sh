# Lead's first device job of session 11 (2026-12-07), one call of <= 590 s:
#   A. k35b's layer parts (brought back into main, compiled only until now): test_gpu on the delta rule and io
#      kernels (plain, vec1, vec2), gemm_add, split_bf16, the Qwen3-Next fixture, streamed experts;
#   B. bench/jobs/q3n48.sh: the 48-layer Qwen3-Next-80B-A3B shape (IQ4_XS experts) all on the GPU, experts on the
#      CPU, and at a 24 GiB cap (issues 25 and 27).
# (The layer bench, bench_gpu_deltanet, runs in the next call beside the new delta-rule kernel.)
# Run: carry [".device/f8"], `OUT=$OUT bash .device/f8/scripts/device run final11:590`, timeout 598.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f11; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-575}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f11.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final11 start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard dn 70 $B test_gpu -tc='*deltanet*,gpu gemm*,gpu split_bf16*,*qwen3next*,qwen3_next*,*streamed*'
grep -E "ERROR|FATAL|FAILED|test cases:|assertions:" "$O/dn.log" | cut -c1-240 | head -30
mkdir -p /tmp/q3o
O=/tmp/q3o LIMIT=$(($(rem) - 5)) bash "$(dirname "${BASH_SOURCE[0]}")/q3n48.sh"
tar czf "$OUTD/q3o.tgz" -C /tmp/q3o . 2>/dev/null
echo "== final11 done t=$((SECONDS - T0))"; pack
