# k31d (issue 26): where the all-GPU decode step's microseconds go, and the
# decode-launch variants, on the Q4_K_M 8-layer Qwen3-30B-A3B-shaped slice.
#   1. `hmoe bench SLICE --decode-kernels` under main's launches
#      (--gpu-decode-fuse none: cuBLAS router + top-k launch, separate last
#      residual add) and under k31d's default (router,tail_norm,
#      expert_prefetch): the last
#      step's graph node by node (each kernel alone and in the graph, bytes,
#      GB/s against the read probe; sums per kernel and per part).
#   2. the GPU tests k31d touched (test_gpu_decode_step.cpp,
#      test_gpu_gguf_native.cpp).
#   3. `hmoe bench SLICE -p 0 -n 64 -r 3 --batch 1,8` under each variant
#      (fused launches, blocks per SM of the GGUF decode grids) while time is
#      left; a summary of every tok/s line at the end.
# Needs $B (a root packed with BUILD/bin/hmoe, BUILD/bin/slice_gguf and
# BUILD/tests/test_gpu, plus the llama-cpu bundle for llama-quantize when the
# slice is not yet in /tmp/sbs) and $O or $OUT. Every step has its own time
# limit; the whole job stays under LIMIT (default 195 s) and writes its files
# under $O as it goes.
set -u
O=${O:-${OUT:-/tmp/out}}; mkdir -p "$O"
T0=$SECONDS; LIMIT=${LIMIT:-195}
left() { echo $((LIMIT - (SECONDS - T0))); }
guard() {  # NAME SECS CMD...: runs CMD with output in $O/NAME.log, killed after SECS (a stall leaves its threads' stacks in NAME.hung)
  local name=$1 lim=$2; shift 2; local t0=$SECONDS rc=124
  "$@" >"$O/$name.log" 2>&1 &
  local pid=$!
  while ((SECONDS - t0 < lim)); do
    if ! kill -0 $pid 2>/dev/null; then wait $pid; rc=$?; break; fi
    sleep 1
  done
  if ((rc == 124)) && kill -0 $pid 2>/dev/null; then
    { echo "== HUNG after $lim s: $*"; for t in /proc/$pid/task/*; do echo "-- $t $(cat $t/comm) $(cat $t/wchan 2>/dev/null)"; cat $t/stack 2>/dev/null | head -6; done
      nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv 2>&1; } >"$O/$name.hung" 2>&1
    kill -9 $pid 2>/dev/null; sleep 1
  fi
  echo "$name rc $rc in $((SECONDS - t0)) s"
}
echo "== k31d start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1)"
W=/tmp/sbs; mkdir -p "$W"
SLICE=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
if [[ ! -s $SLICE ]]; then
  echo "== slice t=$((SECONDS - T0))"
  ( W=$W TYPES=Q4_K_M QUANT_SECS=100 source bench/jobs/slices.sh ) >"$O/slices.txt" 2>&1; cat "$O/slices.txt"
fi
[[ -s $SLICE ]] || { echo "no slice: $SLICE"; exit 1; }

bench() {  # NAME SECS FUSE BLOCKS_PER_SM [EXTRA ARGS...]
  local name=$1 lim=$2 fuse=$3 bps=$4; shift 4
  if (($(left) < lim)); then echo "skip $name: $(left) s left"; return; fi
  echo "== $name: --gpu-decode-fuse $fuse --gpu-gguf-decode-blocks-per-sm $bps $* t=$((SECONDS - T0))"
  guard "$name" "$lim" $B hmoe bench "$SLICE" -p 0 -n 64 -r 3 --batch 1,8 --gpu-resident-moe-layers all --progress none \
    --gpu-decode-fuse "$fuse" --gpu-gguf-decode-blocks-per-sm "$bps" "$@"
  grep -E "^\| tg|^batch [0-9]+:" "$O/$name.log"
}
# 1. the per-kernel tables (main's launches, then k31d's default)
bench kernels-main 45 none 2 --decode-kernels
D=router,tail_norm,expert_prefetch  # k31d's default
bench kernels-k31d 45 $D 2 --decode-kernels
for f in kernels-main kernels-k31d; do
  [[ -f $O/$f.log ]] || continue
  echo "== $f: per kernel and per part"; awk '/^\| kernel \||^\| part \(all layers\)/,/^$/' "$O/$f.log"
done
# 2. the tests k31d touched
for f in test_gpu_decode_step test_gpu_gguf_native; do
  (($(left) > 50)) || { echo "skip $f: $(left) s left"; continue; }
  guard "tg-$f" 45 $B test_gpu -sf="*$f.cpp"
  grep -E "^\[doctest\] (test cases|assertions)|ERROR|FAILED|clear-margin" "$O/tg-$f.log" | head -12
done
# 3. the variants, most promising first
bench v-norm-qkv 25 $D,norm_qkv 2
bench v-no-prefetch 25 router,tail_norm 2
bench v-bps1 25 $D 1
bench v-norm-both 25 $D,norm_qkv,norm_router 2
bench v-norm-qkv-bps1 25 $D,norm_qkv 1
bench v-all 25 all 2
echo "== summary (tok/s: test | batch | context | tok/s | +- sd | ms per step | ...)"
for f in kernels-main kernels-k31d v-norm-qkv v-no-prefetch v-bps1 v-norm-both v-norm-qkv-bps1 v-all; do
  [[ -f $O/$f.log ]] && grep -E "^\| tg" "$O/$f.log" | sed "s/^/$f /"
done
echo "== k31d done t=$((SECONDS - T0))"
