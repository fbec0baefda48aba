# The low-bit GGUF types on the GPU (issue 28, GPU half): their tests and
# their GB/s rows. Needs two binaries of a CUDA build (sm_90) and the fixtures,
# packed with
#   scripts/device pack BUILD BUILD/tests/test_gpu BUILD/bench/bench_gpu_gguf_lowbit
# and runs in about 2 minutes on an H100 host.
# 1. correctness (tests/gpu/test_gpu_gguf_lowbit.cpp): decoders on the host,
#    dequant bit for bit against the CPU, GEMV / decode experts / grouped
#    prefill against the CPU weights' products, deepseek2 files of every type
#    with all layers on the GPU against the CPU path's top-1.
timeout 200 $B test_gpu -tc='gpu gguf low-bit*' 2>&1 | grep -E "MESSAGE|ERROR|FATAL|test cases|assertions|Status" | tail -80
# 2. what this touched beside: the older GGUF kernels (shared decoder plumbing,
#    dequant rounding), the GGUF models on the GPU, and DeepSeek's MLA / dense
#    MLP now behind GpuDense (bf16 checkpoints: the same cuBLAS calls as before).
timeout 150 $B test_gpu -tc='gpu gguf*,GGUF*,tiny-qwen3moe-Q8_0.gguf*,tiny-deepseekv3*' -tce='gpu gguf low-bit*' 2>&1 | grep -E "ERROR|FATAL|test cases|assertions|Status" | tail -20
# 3. GB/s per type (Q4_K baseline, then the 12 low-bit types) at DeepSeek-V3 shapes.
timeout 200 $B bench_gpu_gguf_lowbit --reps 10 2>&1 | tail -90
