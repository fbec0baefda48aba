# k26s must-show (issue 26 "Hybrid", issue 27 GPU expert cache), <= 90 s: experts on the host
# (--gpu-resident-moe-layers none) on the 8-layer Q4_K_M slice, split decode and the GPU expert cache
# on (default: auto split, auto cache) against off (--gpu-expert-cache 0), decode tok/s with the
# stderr line "split decode: routed pairs GPU x% / CPU y%, ... hit rate ..., PCIe GB/s"; pp512/pp4096
# with GGUF streamed prefill (j26h-native port); then the Q8_0 slice's decode both ways.
# Runs from merged main's device root with $B, $O (output dir), $SLICE_Q4KM, $SLICE_Q8_0 set; each
# step under its own timeout, output written to files under $O as it goes.
set -u
O=${O:-${OUT:-/tmp/out}}; mkdir -p "$O"
F=${SLICE_Q4KM:?SLICE_Q4KM not set}
t=$SECONDS
timeout 12 $B hmoe plan "$F" --gpu-resident-moe-layers none >"$O/k26s_plan_none.txt" 2>&1
echo "k26s plan rc $? ($((SECONDS - t)) s)"; grep -A1 "GPU expert cache" "$O/k26s_plan_none.txt"
run_bench() {  # name limit file extra-args...
  local name=$1 lim=$2 file=$3; shift 3; local t0=$SECONDS
  timeout "$lim" $B hmoe bench "$file" --threads 16 --gpu-resident-moe-layers none "$@" >"$O/k26s_$name.md" 2>"$O/k26s_$name.err"
  echo "k26s bench $name rc $? ($((SECONDS - t0)) s): $*"
  grep -E "^\| (pp|tg)|^split decode" "$O/k26s_$name.md"
}
run_bench q4km_split 28 "$F" -p 512,4096 -n 64 -r 2
run_bench q4km_off 24 "$F" -p 512,4096 -n 64 -r 2 --gpu-expert-cache 0
[ -n "${SLICE_Q8_0:-}" ] && run_bench q8_split 13 "$SLICE_Q8_0" -p 0 -n 64 -r 2
[ -n "${SLICE_Q8_0:-}" ] && run_bench q8_off 12 "$SLICE_Q8_0" -p 0 -n 64 -r 2 --gpu-expert-cache 0
echo "k26s done t=$((SECONDS - t)) s"
