set -u
W=/tmp/sbs; O=${OUT:-/tmp/out}
SLICE=$W/qwen3-30b-a3b-slice-8L-Q4_K_M.gguf
for k in direct; do
  timeout 150 /usr/local/cuda/bin/ncu --graph-profiling node --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active --csv -c 400 \
    env HMOE_GPU_GGUF_DECODE_KERNEL=$k $B hmoe bench "$SLICE" -p 0 -n 4 -r 1 --batch 1 --gpu-resident-moe-layers all --progress none >$O/ncu-$k.csv 2>$O/ncu-$k.err
  echo "ncu $k rc $? lines $(wc -l <$O/ncu-$k.csv)"; tail -3 $O/ncu-$k.err
done
cd $O && tar czf ncu.tgz ncu-* && rm -f ncu-*
