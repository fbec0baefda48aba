# The next device job (session 11). Merge branch k35b into main first: its layer parts (precise projections by a
# beta = 1 accumulation, vec2 conv + gates, vectorised io for every delta rule) were compiled only; they were merged
# and reverted in session 10 when the device time ran out before they ran. The default delta rule is v4 already.
#   A. test_gpu: the delta rule and io kernels (plain, vec1, vec2), gemm_add, split_bf16; the Qwen3-Next fixture and
#      its head_dim-256 and GGUF cases under the defaults; streamed-expert cases
#   B. bench_gpu_deltanet --reps 3 --kernels v2,v4: the layer at 4k and 32k against its roof (bar: 50%)
# Run: carry [".device/f8"], `TOTAL=200 OUT=$OUT bash .device/f8/scripts/device run final10c:210`, timeout 220.
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/f10c; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-200}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/f10c.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== final10c start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard dn 60 $B test_gpu -tc='*deltanet*,gpu gemm*,gpu split_bf16*,*qwen3next*,qwen3_next*,*streamed*'
grep -E "ERROR|FATAL|FAILED|test cases:|assertions:" "$O/dn.log" | cut -c1-240 | head -30
guard dbench 120 $B bench_gpu_deltanet --reps 3 --kernels v2,v4
grep -vE "^\s*$" "$O/dbench.log" | head -120
echo "== final10c done t=$((SECONDS - T0))"; pack
