# Which decode feature hangs the split-decode / expert-cache test
# (test_gpu_expert_cache.cpp, skipped by default since its first GPU run hung)?
# Each variant runs under final3.sh's guard (records a hung process's stacks).
# Run from a root packed as for final3.sh: scripts/device run expert_cache_diag:100
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
source <(sed -n '/^guard()/,/^}/p' bench/jobs/final3.sh)
for v in "HMOE_GPU_DECODE_FUSION=1" "HMOE_GPU_DECODE_FUSION=0" "HMOE_GPU_PROGRAMMATIC_LAUNCH=0" "HMOE_GPU_DECODE_FUSION=0 HMOE_GPU_PROGRAMMATIC_LAUNCH=0"; do
  n=$(echo "$v" | tr ' =' '__')
  guard "ec-$n" 22 env $v stdbuf -oL -eL $B test_gpu -sf='*test_gpu_expert_cache.cpp' --no-skip
  grep -E "^\[doctest\] (test cases|assertions)|ERROR|MESSAGE" "$O/ec-$n.log" | cut -c1-300 | head -12
  [[ -f $O/ec-$n.hung ]] && grep -m3 -E "^#" "$O/ec-$n.hung"
done
guard "mc" 20 env HMOE_GPU_DECODE_FUSION=1 stdbuf -oL $B test_gpu -sf='*test_gpu_memory_cap.cpp'
grep -E "^\[doctest\] (test cases|assertions)|ERROR|values" "$O/mc.log" | head -8
