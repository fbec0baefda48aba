# Where does the split-decode / expert-cache hang stand (test_gpu_expert_cache.cpp,
# whose first two cases are skipped by default since their first GPU run hung)?
# First the two device pieces the split path adds, on their own: a batched
# copy (cudaMemcpyBatchAsync, never run on a GPU before) from a pinned file
# map between a copy and a step stream, and the time to pin a 1 GiB file map
# in place (the 8-layer slice's `hmoe bench` stalled inside the load, before
# the cache's VRAM slots existed: nvidia-smi showed 1560 MiB, the context and
# the non-expert weights). Then the cache cases.
# Each run is one test case (-tc) under a guard like final3.sh's, with the
# loads' progress lines (HMOE_PROGRESS=lines: "measuring host read and pinned
# PCIe bandwidths", "pinning the host experts ... in place", "host experts
# pinned in place", the cache's describe line, "loaded in ...") so the log
# says whether a stall is in the load (which step) or in the decode steps.
# On a stall the guard also records, for every thread, the CPU time spent in
# user and in kernel mode twice one second apart (a thread whose stime grows
# loops inside the kernel, e.g. a driver call pinning memory; one whose utime
# grows spins in user space, e.g. a CUDA synchronisation or a host loop) and
# the system call it is in (/proc/.../syscall: "running" = user space), then
# eu-stack/gdb stacks where those tools exist.
# Must-show of the next device call (at most 100 s): per run, "rc 0" with the
# doctest summary, or the last progress line before the stall plus the
# main thread's utime/stime growth and syscall.
# Run from a root packed as for final3.sh: scripts/device run expert_cache_diag:100
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
T0=$SECONDS
sample() {  # PID: per thread: comm state utime stime (clock ticks) and syscall
  local t
  for t in /proc/$1/task/*; do
    echo "$(basename "$t") $(cat "$t/comm" 2>/dev/null) $(awk '{print $3, "utime", $14, "stime", $15}' "$t/stat" 2>/dev/null) syscall $(cut -d' ' -f1 "$t/syscall" 2>/dev/null)"
  done
}
guard() {  # NAME LIMIT CMD...: output in $O/NAME.log; rc in $rc (124: limit); stall report in $O/NAME.hung
  local name=$1 lim=$2; shift 2; local t0=$SECONDS
  "$@" >"$O/$name.log" 2>&1 &
  local pid=$! ; rc=124
  while ((SECONDS - t0 < lim)); do
    if ! kill -0 $pid 2>/dev/null; then wait $pid; rc=$?; break; fi
    sleep 1
  done
  if ((rc == 124)) && kill -0 $pid 2>/dev/null; then
    local p=$pid c; c=$(pgrep -P $pid | head -1); [[ -n $c ]] && p=$c  # env/stdbuf exec; a wrapper shell has the program as child
    { echo "== STALLED after $lim s: $*"; echo "-- threads (tid comm state utime stime syscall), then again 1 s later:"; sample "$p"; sleep 1; sample "$p"
      echo "-- main thread wchan $(cat /proc/$p/wchan 2>/dev/null); kernel stack:"; cat /proc/$p/task/$p/stack 2>/dev/null | head -12
      command -v eu-stack >/dev/null && timeout 5 eu-stack -p "$p" 2>&1 | head -80
      command -v gdb >/dev/null && timeout 5 gdb -batch -p "$p" -ex "thread apply all bt 12" 2>&1 | grep -E "^#|^Thread" | head -80
      nvidia-smi 2>&1 | tail -6; } >"$O/$name.hung" 2>&1
    kill -9 $pid $(pgrep -P $pid) 2>/dev/null; sleep 1
  fi
  echo "$name rc $rc in $((SECONDS - t0)) s"
}
show() {  # NAME: the summary, progress and messages of a run, and its stall report
  grep -E "^\[doctest\] (test cases|assertions)|ERROR|MESSAGE|^hmoe: (GPU expert cache|loaded)|CHECK|REQUIRE" "$O/$1.log" 2>/dev/null | cut -c1-240 | tail -14
  [[ -f $O/$1.hung ]] && grep -vE "^$" "$O/$1.hung" | head -60
}
run_case() {  # NAME LIMIT TC ENV...: one test case with progress lines
  local name=$1 lim=$2 tc=$3; shift 3
  local left=$((100 - (SECONDS - T0) - 12))  # room for a stall report after it
  ((left >= 6)) || { echo "$name: no time left"; return; }
  ((lim > left)) && lim=$left
  guard "$name" "$lim" env HMOE_PROGRESS=lines "$@" stdbuf -oL -eL $B test_gpu -sf='*test_gpu_expert_cache.cpp' -tc="$tc" --no-skip
  show "$name"
}
# 0. cudaMemcpyBatchAsync alone, as split() issues it (never run on a GPU before this job).
run_case ec-copy-batch 8 'copy_batch_to_device*'
# 0b. Pinning a 1 GiB read-only file map in place (the big slice's load stalled before the cache's slots existed).
run_case ec-pin-big 12 'a 1 GiB read-only file map pinned*'
# 1. The case that hung, as it runs today (fusion off, programmatic launch on).
run_case ec-split 20 'split decode and the GPU expert cache*'
# 2. Programmatic launch off: the split's GPU share launched after a copy and an event wait.
run_case ec-split-nopdl 12 'split decode and the GPU expert cache*' HMOE_GPU_PROGRAMMATIC_LAUNCH=0
# 3. The 3-slot case (every miss copied): each launch checked where it is made.
run_case ec-slots-blocking 12 'GPU expert cache of 3 slots*' CUDA_LAUNCH_BLOCKING=1
# 4. If time is left: the memory-cap test with the fused decode kernels (failed in the 16:41 call).
left=$((100 - (SECONDS - T0) - 4))
if ((left >= 14)); then
  guard mc $((left < 15 ? left : 15)) env HMOE_GPU_DECODE_FUSION=1 stdbuf -oL $B test_gpu -sf='*test_gpu_memory_cap.cpp'
  grep -E "^\[doctest\] (test cases|assertions)|ERROR|values" "$O/mc.log" | head -8
fi
echo "expert_cache_diag done in $((SECONDS - T0)) s"
