# All-GPU decode on the GGUF slices (issue 26 item 3 GPU, branch k26d):
# `hmoe bench --decode-breakdown` on each slice: tok/s at batch 1 and 8, the
# CUDA graphs and kernels one step replays, ms per step, the weight bytes a
# step reads and the GB/s that makes against the device's read bandwidth,
# the step's kernels by name, and per layer the attention / feed-forward
# time of one step launched plainly with events between the parts. The
# defaults (programmatic launch and fused decode kernels on) first, then the
# Q4_K_M slice with both off (main's launches, same binary, same call), then
# each off alone while time is left.
# Needs $B (a root packed with BUILD/bin/hmoe), $SLICE_Q4KM and $SLICE_Q8_0
# (bench/side_by_side.sh's recipe), $O or $OUT. About 90 s on an H100 once
# the slices exist; every step has its own time limit and writes its files
# under $O as it goes. test_gpu is run apart (filters in bench/README.md).
set -u
O=${O:-${OUT:-/tmp/out}}; mkdir -p "$O"
T0=$SECONDS
bench() {  # NAME LIMIT FILE [VAR=VALUE...]
  local name=$1 limit=$2 file=$3; shift 3
  [[ -n $file && -f $file ]] || { echo "$name: no file"; return; }
  echo "== k26d $name $* $(date -u +%T) t=$((SECONDS - T0))"
  env "$@" timeout "$limit" $B hmoe bench "$file" -p 0 -n 64 -r 3 --batch 1,8 --gpu-resident-moe-layers all --progress none --decode-breakdown \
    >"$O/k26d-$name.md" 2>"$O/k26d-$name.err"
  echo "k26d $name rc $?"; cat "$O/k26d-$name.md"; tail -3 "$O/k26d-$name.err"
}
bench q4km 30 "${SLICE_Q4KM:-}"
bench q8_0 35 "${SLICE_Q8_0:-}"
bench q4km-main-launches 25 "${SLICE_Q4KM:-}" HMOE_GPU_PROGRAMMATIC_LAUNCH=0 HMOE_GPU_DECODE_FUSION=0
if ((SECONDS - T0 < 66)); then bench q4km-no-pdl 12 "${SLICE_Q4KM:-}" HMOE_GPU_PROGRAMMATIC_LAUNCH=0; fi
if ((SECONDS - T0 < 78)); then bench q4km-no-fusion 12 "${SLICE_Q4KM:-}" HMOE_GPU_DECODE_FUSION=0; fi
echo "== k26d done t=$((SECONDS - T0))"
