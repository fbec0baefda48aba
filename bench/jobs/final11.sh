# Lead's first device job of session 11 (2026-12-07), one call of <= 590 s:
#   A. k35b's layer parts (brought back into main, compiled only until now): test_gpu on the delta rule and io
#      kernels (plain, vec1, vec2), gemm_add, split_bf16, the Qwen3-Next fixture, streamed experts; then
#      bench_gpu_deltanet --reps 3 --kernels v2,v4 (the layer at 4k and 32k against its roof; v4's walk 1 and walk 2);
#   B. issue 27's 32k prefill on the 48-layer Q8_0-expert model at a 24 GiB cap, streamed against the CPU experts
#      (bench/jobs/k27b.sh part 4);
#   C. test_gpu whole with the time left (not run whole since session 9; the next call repeats it if cut).
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
guard dbench 110 $B bench_gpu_deltanet --reps 3 --kernels v2,v4
grep -vE "^\s*$" "$O/dbench.log" | head -120
mkdir -p /tmp/k27o
O=/tmp/k27o LIMIT=$(($(rem) - 40)) K27B_PART=4 bash "$(dirname "${BASH_SOURCE[0]}")/k27b.sh"
tar czf "$OUTD/k27o.tgz" -C /tmp/k27o . 2>/dev/null
guard all 300 $B test_gpu
grep -E "ERROR|FATAL|FAILED|test cases:|assertions:|^\[doctest\] Status" "$O/all.log" | cut -c1-240 | head -40
tail -3 "$O/all.log"
echo "== final11 done t=$((SECONDS - T0))"; pack
