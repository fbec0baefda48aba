# k31c device job (issues 26/27): the host experts' residence for GPU DMA
# (engine/layers/host_residence.h, --gpu-pin-host-experts). Hybrid Q4_K_M
# 8-layer slice (bench/jobs/slices.sh; reused when an earlier job of the call
# made it), every MoE layer's experts on the CPU, `hmoe bench -p 512,4096
# -n 32 -r 2` under copy (node memory registered at load; off stays the default until this job has run)
# and off (the file map read as pageable memory, the stop-gap before it),
# then both again with the GPU expert cache on (split decode). Prints per
# run the load time, the residence line (bytes copied, registration time and
# s/GB), the streamed prefill's achieved GB/s and the tok/s table. Then the
# copy residence's GPU tests (registration of 256 MiB of node memory; the
# streamed block types under copy/off/map) if time is left.
# Every step runs under guard (a stalled process's threads and stacks are
# recorded, it is killed, the job moves on); total <= LIMIT (200 s).
# Run: pack a CUDA build (sm_90) with hmoe, slice_gguf and test_gpu, add the
# llama-cpu bundle (llama-quantize) and slices.sh (bench/jobs/ or
# .device/jobs/ of the device root) as for lead1.sh, this file in
# .device/jobs/, then `OUT=$OUT bash .device/ROOT/scripts/device run k31c:200`.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
LIMIT=${LIMIT:-200}; echo "LIMIT $LIMIT"
W=${W:-/tmp/sbs}; mkdir -p "$W"
# The step runner: bench/jobs/guard.sh (in a device root: beside this job, or under bench/jobs/).
for g in "$(dirname "${BASH_SOURCE[0]}")/guard.sh" bench/jobs/guard.sh; do [[ -f $g ]] && { source "$g"; break; }; done
declare -F guard >/dev/null || { echo "guard.sh not found"; exit 1; }
left() { echo $((LIMIT - 5 - SECONDS)); }
echo "== k31c start $(date -u +%T) $(nvidia-smi --query-gpu=name --format=csv,noheader) MemAvailable $(grep MemAvailable /proc/meminfo)"
q=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
if [[ ! -s $q ]]; then
  sl=bench/jobs/slices.sh; [[ -f $sl ]] || sl=.device/jobs/slices.sh
  ( TYPES=Q4_K_M QUANT_SECS=$(( $(left) > 170 ? 70 : $(left) / 3 )) source "$sl" ) >"$O/slices.txt" 2>&1
  cat "$O/slices.txt"
fi
[[ -s $q ]] || { echo "no slice: stop"; exit 0; }
echo "slice $(ls -la "$q") t=$SECONDS"
# NAME RESIDENCE CACHE: one hmoe bench run, its residence lines and table.
bench() {
  local name=$1 res=$2 cache=$3 lim
  lim=$(left); ((lim > 40)) && lim=40
  ((lim > 15)) || { echo "== $name: no time left (t=$SECONDS)"; return; }
  echo "== $name: --gpu-pin-host-experts $res --gpu-expert-cache $cache t=$SECONDS (limit $lim s)"
  guard "$name" "$lim" $B hmoe bench "$q" -p 512,4096 -n 32 -r 2 --gpu-resident-moe-layers none --gpu-pin-host-experts "$res" \
    --gpu-expert-cache "$cache" --progress lines
  grep -E "host experts|loaded in|streaming experts|streamed experts|split decode|GPU expert cache:|notice|^\||tok/s|Error|error" "$O/$name.log" | head -40
}
bench copy copy 0
bench off off 0
bench copy-cache copy auto
bench off-cache off auto
lim=$(left); ((lim > 30)) && lim=30
if ((lim > 10)); then
  echo "== test_gpu: registration of node memory, streamed block types under copy/off/map t=$SECONDS (limit $lim s)"
  guard tg-residence "$lim" $B test_gpu -tc='*copy residence*,*GGUF block types streamed*'
  grep -E "registered in|residence|rel. error|off vs copy|ERROR|FAILED|test cases:|assertions:" "$O/tg-residence.log" | head -40
fi
echo "== done t=$SECONDS"
