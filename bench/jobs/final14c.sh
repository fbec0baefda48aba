# Lead's follow-up device job of session 15 (fresh or warm machine), <= 440 s:
#   A. q3n48.sh step "fit": on the 48-layer Qwen3-Next shape at the 24 GiB cap, auto + expert cache on the Zipf
#      trace with the automatic fit told the trace (--fit-routing-trace, new), then the best static placement (12
#      resident) on the same trace (issue 27's ">= 1.3x the best static on the Zipf trace": 1.27x / 1.34x at batch
#      1 / 8 in final14 with the fit assuming uniform routing);
#   B. the AVX-512 one-token GGUF GEMV on the Xeon, 16 threads, old (HEAD~2's prefetch: 4 KiB cap) against new
#      (next tile's rows up to 16 KiB), lm_head shape [151936 x 2048], Q6_K / Q8_0 / Q4_K, in turns;
#   B2. bench_gguf_lowbit --type Q3_K / IQ4_NL / IQ2_XXS at 16 threads, before (lowbit_old) and after the low-bit
#      kernels' prefetch fix;
#   C. k27b.sh part 5: the same fit row on the 48-layer Qwen3-30B-A3B shape (Q8_0 experts) against static r28.
# Run: carry [".device/f14"], `TOTAL=430 OUT=$OUT bash .device/f14/scripts/device run final14c:440`.
set -u
OUTD=${OUT:-/tmp/out}; mkdir -p "$OUTD"; T0=$SECONDS; TOTAL=${TOTAL:-430}
rem() { echo $((TOTAL - (SECONDS - T0))); }
here=$(dirname "${BASH_SOURCE[0]}")
echo "== final14c start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
mkdir -p /tmp/q3f
if [[ ${F14C_SHORT:-0} == 1 ]]; then  # a short budget: the fit row alone (static r12 if time is left), one GEMV pair per type
  O=/tmp/q3f PACK_TAR="$OUTD/q3f.tgz" LIMIT=$(($(rem) - 14)) Q3N_STEPS=fit bash "$here/q3n48.sh"
  tar czf "$OUTD/q3f.tgz" -C /tmp/q3f . 2>/dev/null
  for t in q6_k q8_0; do (($(rem) > 6)) && { timeout 6 $B gemv_old $t 16 0 | sed 's/^/old /'; timeout 6 $B gemv_new $t 16 0 | sed 's/^/new /'; }; done
  echo "== final14c done t=$((SECONDS - T0))"; exit 0
fi
O=/tmp/q3f PACK_TAR="$OUTD/q3f.tgz" LIMIT=$(($(rem) - 75)) Q3N_STEPS=fit bash "$here/q3n48.sh"
tar czf "$OUTD/q3f.tgz" -C /tmp/q3f . 2>/dev/null
echo "== gemv (Xeon, 16 threads) t=$((SECONDS - T0))"
for i in 1 2; do for t in q6_k q8_0 q4_k; do
  timeout 20 $B gemv_old $t 16 0 | sed 's/^/old /'; timeout 20 $B gemv_new $t 16 0 | sed 's/^/new /'
done; done
echo "== low-bit experts (Xeon, 16 threads): old (HEAD~1's 4 KiB prefetch cap) / new t=$((SECONDS - T0))"
for t in Q3_K IQ4_NL IQ2_XXS; do for b in lowbit_old bench_gguf_lowbit; do
  timeout 40 $B $b --threads 16 --quick --experts 16 --batch 1 --type $t 2>&1 | grep -E "^\| (Q3_K|IQ4_NL|IQ2_XXS) " | cut -d'|' -f2,5,8,9,12,13 | sed "s/^/$b /"
done; done
rm -rf /dev/shm/q3n48
mkdir -p /tmp/k27f
O=/tmp/k27f K27B_PART=5 LIMIT=$(($(rem) - 5)) bash "$here/k27b.sh"
tar czf "$OUTD/k27f.tgz" -C /tmp/k27f . 2>/dev/null
echo "== final14c done t=$((SECONDS - T0))"
