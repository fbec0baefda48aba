# CPU decode that stays flat with context (issue 26): the head-major KV
# cache and its attention kernel on this machine's CPU, per KV dtype.
# Needs two binaries of a CPU (or CUDA) build, packed with
#   scripts/device pack BUILD BUILD/bench/bench_gguf_cpu BUILD/tests/test_engine
# and runs in about 2 minutes on a 16-core Xeon (no fixtures needed).
# 1. correctness on this CPU: the kernels (AVX-512, AVX2, plain C++) against
#    the scalar reference, every KV dtype (test cases named attention*).
$B test_engine -tc='attention*' 2>&1 | tail -6
# 2. attention (ms, KV GB/s against the read bandwidth measured in-process)
#    and the decode step of a whole layer at 512 and 4096 positions (the
#    4096 / 512 ratio), K/V cold (each call reads another layer's), 16 threads
#    then 8.
$B bench_gguf_cpu --threads 16 --attention-only 2>&1 | tail -40
$B bench_gguf_cpu --threads 8 --attention-only --quick 2>&1 | tail -40
# 3. the same with one layer's K/V read again and again (hot in the caches)
$B bench_gguf_cpu --threads 16 --attention-only --quick --kv-layers 1 2>&1 | tail -40
