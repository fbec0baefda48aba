# k32c (issue 25 must-show: top-1 agreement at every reference margin > 0.5 under all-GPU and mixed placements), <= 200 s in all.
# The GPU-resident experts of the tiny Qwen3-Next fixture missed one row of margin 0.61 (chat 0 step 22) that the
# CPU-expert and streamed placements kept: RoutedExperts never passed ExpertHomeOptions::split_act to its GPU home,
# so resident bf16 experts rounded their activation between gate/up and down to one bf16 in every pass while
# streamed experts kept it as hi + lo (gpu::moe_experts act_lo). Fixed on branch k32c; setting
# gpu_hybrid_precise_act (default 1) switches the pair off for checking.
# Pack (from the k32c tree, an sm_90 build-gpu):
#   DEVICE_ROOT=/work/main/.device/k32c scripts/device pack build-gpu build-gpu/tests/test_gpu build-gpu/bench/bench_gpu
#   cp bench/jobs/k32c.sh bench/jobs/guard.sh /work/main/.device/k32c/.device/jobs/
# Run: carry [".device/k32c"], command `OUT=$OUT bash .device/k32c/scripts/device run k32c:210`.
# Must show:
# 1. test_gpu's Qwen3-Next fixture cases pass. The reference case prints per placement "placement ...: top-1 A/B
#    rows of margin > 0.5": all (A = B = 217), 0,2,5 (217/217), none (CPU experts, 217/217), none + streamed
#    (217/217), all + graphs + fusion (217/217); printed only: the bf16 mode (about 206/217) and
#    --gpu-hybrid-precise-act 0 (the resident home before k32c: 216/217, the miss chat 0 step 22 margin 0.61).
#    Each placement prints its 8 largest |logit - reference| ("max |diff|").
# 2. The new case "resident and streamed experts keep their activation as hi + lo" prints per home (all, none
#    streamed) the max |diff| and relative L2 between the pair and one bf16: > 1e-5 (the pair reaches the kernels)
#    and < 5%.
# 3. test_gpu's grouped-expert kernel case (act_lo against numa::moe_forward) passes.
# 4. bench_gpu --moe-only: gpu::moe_experts at Qwen3-30B-A3B and Qwen3-Next-80B-A3B shapes at 1/8/64/512 tokens,
#    us and GB/s of the active experts' weights without and with the pair ("hi+lo +%": what the precise mode
#    costs the routed experts per layer; no extra launch, 2 x pairs x I x 2 bytes more).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
LIMIT=${LIMIT:-200}
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
rem() { echo $((LIMIT - SECONDS)); }
echo "== k32c start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard next 120 $B test_gpu -tc='*qwen3next*,*qwen3_next*'
grep -E "placement |  miss:|max \|diff\||relative L2|activation pair|ERROR|FAILED|test cases:|assertions:" "$O/next.log" | head -120
guard kern 20 $B test_gpu -tc='gpu grouped experts*'
grep -E "ERROR|FAILED|test cases:|assertions:" "$O/kern.log" | head -10
guard moe 50 $B bench_gpu --moe-only
cat "$O/moe.log" | head -30
echo "== k32c done t=$SECONDS"
