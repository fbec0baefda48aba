# k32a (issue 28, CPU half): the low-bit expert GEMV on the device's Xeon with v5 (IQ1_S / IQ1_M repacked
# at load into base-3 trits, setting cpu_lowbit_repack) and v4's row d gathered once per row.
# Needs $B bench_gguf_lowbit and $B test_numa (CPU code; any build of this branch). Logs under /tmp/k32a,
# tarred to $OUT/k32a.tgz after every step. Must show:
#   1. test_numa's low-bit cases pass on the Xeon (v5 against the reference, the engine with repack on/off);
#   2. bench_gguf_lowbit --threads 16 --quick --experts 16 --compare-v2: "CPU-time GB/s / read bw" per type at
#      batch 1 (the file's bytes), "same over bytes read" (v5 reads 58/50, 66/56 of them) and the v4 / v2 columns
#      in the same turns: IQ1_S / IQ1_M at >= 0.8 is the target;
#   3. bench_gguf_lowbit --kernel --quick: the per-core ns per group and GB/s of every kernel (v5 beside v4, v2).
set -u
OUTD=${OUT:-/tmp/out}; O=/tmp/k32a; mkdir -p "$O" "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-240}
rem() { echo $((TOTAL - (SECONDS - T0))); }
pack() { tar czf "$OUTD/k32a.tgz" -C "$O" . 2>/dev/null; }
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
echo "== k32a start $(date -u +%T) $(grep -m1 'model name' /proc/cpuinfo) $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
guard tests 40 $B test_numa -tc='low-bit GGUF types*'
grep -E "^\[doctest\] (test cases|assertions)|ERROR|FAILED" "$O/tests.log" | head -8
guard lowbit 120 $B bench_gguf_lowbit --threads 16 --quick --experts 16 --compare-v2
grep -E "^#|^\| (IQ|Q2_K|Q3_K|MXFP4|Q4_K)" "$O/lowbit.log" | head -40
guard kernel 60 $B bench_gguf_lowbit --kernel --quick
grep -E "^\| " "$O/kernel.log" | head -30
echo "== k32a done t=$((SECONDS - T0))"; pack
