# k33b (issue 25: the Gated DeltaNet layer toward 50 % of roof at 32k-token prefill), <= 150 s in all.
# Pack (from the k33b tree, an sm_90 build-gpu):
#   DEVICE_ROOT=/work/main/.device/k33b scripts/device pack build-gpu build-gpu/tests/test_gpu build-gpu/bench/bench_gpu_deltanet
#   cp bench/jobs/k33b.sh bench/jobs/guard.sh /work/main/.device/k33b/.device/jobs/
# Run: carry [".device/k33b"], command `OUT=$OUT bash .device/k33b/scripts/device run k33b:150`.
# Logs under $OUT/k33b (and $OUT/k33b.tgz, re-packed after every step).
# Must show:
# 1. dn: test_gpu's Gated DeltaNet cases pass with v1, v2 and v3: the whole path (conv + gates, window, chunked and
#    recurrent delta rule, gated norm and its hi + lo split) at the small shape (dk 32, dv 48) and at head dims 128
#    (sequences of 1, 63, 64, 65, 300 and 2 tokens interleaved, fresh and continued states; v3 takes the vectorised
#    conv + gates and gated norm), the delta rule alone at head dims 128 (chunks 64/32/16, 130 + 170 tokens), all
#    against the double reference (1e-4 abs + 1e-3 rel), v2 and v3 against v1 (1e-5 + 1e-4), and the setting / scratch
#    formulas. The MESSAGE lines give each ratio.
# 2. bench: bench_gpu_deltanet --reps 3: the "v2/v3 against v1" lines at 4096 tokens (no MISMATCH), then per T and step
#    the delta rule v1 / v2 / v3, conv+gates and norm+out with the plain kernels ("v2") and v3's vectorised ones ("v3"),
#    and the layer (precise and bf16) with each kernel; the "% roof" column of the "layer" rows at T 32768, step 2048
#    is issue 25's figure (bar: 50).
# 3. bench_v12 (only if step 2 failed): the same with --kernels v1,v2 (the baseline, should v3 crash the process).
# 4. mem (only if step 1 failed, time allowing): compute-sanitizer memcheck on the head-dims-128 cases.
set -u
OUTD=${OUT:-/tmp/out}; O=$OUTD/k33b; mkdir -p "$O"; T0=$SECONDS; TOTAL=${TOTAL:-148}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/k33b.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== k33b start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard dn 45 $B test_gpu -tc='gated deltanet*'
dn_rc=$rc
grep -E "delta-rule output|head dims 128|against v1|130 \+ 170|ERROR|FAILED|test cases:|assertions:" "$O/dn.log" | head -60
guard bench 80 $B bench_gpu_deltanet --reps 3
bench_rc=$rc
head -80 "$O/bench.log"
if ((bench_rc != 0)); then
  guard bench_v12 40 $B bench_gpu_deltanet --reps 3 --kernels v1,v2
  head -60 "$O/bench_v12.log"
fi
if ((dn_rc != 0)); then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [[ -n $CS ]]; then
    guard mem 40 "$CS" --tool memcheck $B test_gpu -tc='gated deltanet whole path*,gated deltanet chunked*'
    grep -E "Invalid|out of bounds|misaligned|ERROR SUMMARY|test cases:" "$O/mem.log" | head -20
  fi
fi
echo "== k33b done t=$((SECONDS - T0))"; pack
