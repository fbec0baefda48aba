# k31a (issue 25: Qwen3-Next's real attention shape, head_dim 256, on the GPU), <= 300 s in all.
# Pack (from the k31a tree, an sm_90 build-gpu):
#   DEVICE_ROOT=/work/main/.device/k31a scripts/device pack build-gpu build-gpu/tests/test_gpu \
#     build-gpu/bench/bench_gpu build-gpu/bench/bench_gpu_qwen3next
#   cp bench/jobs/k31a.sh /work/main/.device/k31a/.device/jobs/
# Run: carry [".device/k31a"], command `OUT=$OUT bash .device/k31a/scripts/device run k31a:300`.
# Must show:
# 1. test_gpu's attention cases pass, among them the new head_dim 256 case (16 q / 2 kv heads against the
#    scalar reference: decode at contexts 1..4100 with 1, 3, 6 and 17 split-K slices, and two prompt chunks
#    in 32-key tensor-core tiles; its MESSAGE lines print the worst |diff| / tolerance), the fused
#    norm_rope_store_attention at hd 160/256 bit for bit against the unfused launches, and the gated
#    attention kernels at 16/2 x 256 with 64 rotary dimensions.
# 2. test_gpu's Qwen3-Next cases: the new 4-layer head_dim-256 model (16/2 heads, 64 rotary) all-GPU against
#    the fp32 CPU runtime (prompt in tiles and per token, split-K decode: relative L2 <= 5%, top-1 on >= 95%
#    of the rows of margin > 0.5; its MESSAGE lines print both), and the tiny fixture's cases (head_dim 32:
#    the 128-thread kernels) as before.
# 3. bench_gpu --attention-only: decode GB/s and prefill TFLOP/s at hd 128 (32/4; compare with the
#    earlier rows in bench/README.md: the hd <= 128 code is unchanged) and at hd 256 (16/2).
# 4. bench_gpu_qwen3next with the real shapes (16 x 256 full attention), 8 of 48 layers: prefill and
#    then decode at contexts 4096 and 32768, all-GPU and experts on the CPU (prompts streamed from the
#    automatic minimum batch), against weight bytes (+ K/V + states) / measured bandwidth and FLOPs /
#    measured tensor throughput, with the 48-layer bound beside each decode row.
# Every step runs under guard (a stalled process's threads and stacks recorded, then killed).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
LIMIT=${LIMIT:-295}
# The step runner: bench/jobs/guard.sh (in a device root: beside this job, or under bench/jobs/).
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
left() { local l=$((LIMIT - SECONDS)); ((l > $1)) && l=$1; echo $l; }
echo "== k31a start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader)"
guard attn "$(left 45)" $B test_gpu -tc='*qk_norm_rope*,*qkv_norm_rope_store*,gpu attention*,*norm_rope_store_attention*,gated attention kernels*,*tensor-core tiles*'
grep -E "MESSAGE|hd [0-9]+ |ERROR|FAILED|test cases:|assertions:" "$O/attn.log" | grep -v "^$" | head -60
guard next "$(left 80)" $B test_gpu -tc='*qwen3next*,*qwen3_next*'
grep -E "placement |  miss:|relative L2|ERROR|FAILED|test cases:|assertions:" "$O/next.log" | head -40
guard bgpu "$(left 30)" $B bench_gpu --attention-only
cat "$O/bgpu.log" | head -40
l=$(left 160); echo "== bench_gpu_qwen3next t=$SECONDS (limit $l s)"
((l > 30)) && guard next_bench "$l" $B bench_gpu_qwen3next --layers 8 --contexts 4096,32768 --chunk 4096 --steps 32 --skip-bf16
cat "$O/next_bench.log" 2>/dev/null | head -60
echo "== k31a done t=$SECONDS"
