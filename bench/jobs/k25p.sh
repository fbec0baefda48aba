# k25p must-show (issue 25, Qwen3-Next on the GPU), <= 200 s:
# 1. test_gpu's Qwen3-Next cases: the fixture against transformers' reference under all-GPU, mixed
#    (0,2,5), CPU experts, streamed, and all-GPU with CUDA graphs + decode fusion: every row of
#    reference margin > 0.5 must agree in the precise mode (gpu_hybrid_precise, the default); per
#    placement the rows with the largest |logit diff| and every miss with its margin are printed;
#    the bf16 mode (--gpu-hybrid-precise 0, the path before) is printed beside it (206/217 before).
#    Then chunked prefill, batches of two, state reuse, the Q8_0 GGUF; the DeltaNet, gated-attention,
#    grouped-expert (hi + lo activation) and fp32-weight norm kernel tests.
# 2. bench_gpu_qwen3next: a Qwen3-Next-80B-A3B-shaped model of 8 layers (random bf16; 48 layers of
#    bf16 experts are 155 GB), all-GPU precise and bf16 mode, experts on the CPU: decode batch 1 and
#    prefill 4k / 32k (chunks of 4096) against weight bytes / measured bandwidth and FLOPs / measured
#    tensor throughput; at 32k the linear-attention layers' share of tensor throughput and bandwidth.
# Runs from the k25p device root with $B set; output under $O.
set -u
O=${O:-${OUT:-/tmp/out}}; mkdir -p "$O"
t=$SECONDS
timeout 75 $B test_gpu -tc='*qwen3next*,*qwen3_next*,*deltanet*,*DeltaNet*,*grouped experts match*,*add_rms_norm match*' >"$O/k25p_test_gpu.txt" 2>&1
echo "k25p test_gpu rc $? ($((SECONDS - t)) s)"
grep -E "placement |  miss:|largest differences|^  chat|relative L2|max \|diff\||Q8_0 GGUF|activation bf16|within .* of the tolerance|ERROR|FAILED|test cases:|assertions:" "$O/k25p_test_gpu.txt" | head -150
t1=$SECONDS
timeout 115 $B bench_gpu_qwen3next --layers 8 --prefill 4096,32768 --chunk 4096 --steps 32 >"$O/k25p_bench.md" 2>"$O/k25p_bench.err"
echo "k25p bench rc $? ($((SECONDS - t1)) s)"
cat "$O/k25p_bench.md"; tail -5 "$O/k25p_bench.err"
echo "k25p done t=$((SECONDS - t)) s"
