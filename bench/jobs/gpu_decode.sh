# All-GPU decode on the GGUF slices (issue 26 item 3 GPU): test_gpu on the
# decode kernels and the GGUF fixtures, then `hmoe bench --decode-breakdown`
# on each slice (tok/s at batch 1 and 8; the CUDA graphs and kernels one step
# replays, ms per step, weight bytes read per step and GB/s against the
# device's read bandwidth), with programmatic launch and fused decode kernels
# on (the defaults), and each turned off (same binary, same call).
# Needs $SLICE_Q4KM (and $SLICE_Q8_0 if set; see bench/side_by_side.sh for the
# recipe) and a root packed with
#   scripts/device pack BUILD BUILD/bin/hmoe BUILD/tests/test_gpu
# About 150 s on an H100 once the slices exist. Every step has its own time
# limit and writes its files under $OUT as it goes.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
T0=$SECONDS
echo "== test_gpu (decode kernels, GGUF fixtures) $(date -u +%T)"
timeout 90 $B test_gpu -tc='*router*,*norm_rope*,*add_rms_norm*,*attention over*,*GGUF*,*gguf*,*CUDA graphs*,*tiny-qwen3moe on the GPU*,*hybrid decode*' \
  >"$O/test_gpu.log" 2>&1
echo "test_gpu rc $? ($((SECONDS - T0)) s)"; grep -E "test cases|assertions|FAILED|ERROR" "$O/test_gpu.log" | tail -12
bench() {  # NAME FILE [VAR=VALUE...]
  local name=$1 file=$2; shift 2
  [[ -n $file && -f $file ]] || { echo "$name: no file"; return; }
  echo "== $name $* $(date -u +%T) t=$((SECONDS - T0))"
  env "$@" timeout 60 $B hmoe bench "$file" -p 0 -n 64 -r 3 --batch 1,8 --gpu-resident-moe-layers all --decode-breakdown \
    >"$O/$name.md" 2>"$O/$name.err"
  echo "$name rc $?"; cat "$O/$name.md"
}
bench q4km "${SLICE_Q4KM:-}"
bench q8_0 "${SLICE_Q8_0:-}"
bench q4km-no-pdl "${SLICE_Q4KM:-}" HMOE_GPU_PROGRAMMATIC_LAUNCH=0
bench q4km-no-fusion "${SLICE_Q4KM:-}" HMOE_GPU_DECODE_FUSION=0
bench q4km-neither "${SLICE_Q4KM:-}" HMOE_GPU_PROGRAMMATIC_LAUNCH=0 HMOE_GPU_DECODE_FUSION=0
echo "== done t=$((SECONDS - T0))"
