# guard NAME SECS CMD...: the device jobs' step runner (sourced by them).
# Runs CMD with stdout and stderr in $O/NAME.log, kills it after SECS; a
# stalled process leaves its threads' states and kernel stacks, and the
# GPU's utilisation, in $O/NAME.hung. Sets rc (124 when killed) and prints
# "NAME rc RC in S s". Hooks the sourcing job may define: rem (seconds left
# in the job: SECS is capped to it; with < 8 s left the step is skipped)
# and pack (called after each step, e.g. to tar the logs).
guard() {
  local name=$1 lim=$2; shift 2; local t0=$SECONDS
  rc=124
  if declare -F rem >/dev/null; then
    local r; r=$(rem)
    if ((r < 8)); then echo "skip $name: $r s left"; return; fi
    ((lim > r)) && lim=$r
  fi
  "$@" >"$O/$name.log" 2>&1 &
  local pid=$!
  while ((SECONDS - t0 < lim)); do
    if ! kill -0 $pid 2>/dev/null; then wait $pid; rc=$?; break; fi
    sleep 1
  done
  if ((rc == 124)) && kill -0 $pid 2>/dev/null; then
    { echo "== HUNG after $lim s: $*"
      local kids; kids=$(pgrep -d, -P $pid)
      ps -Lo pid,tid,stat,wchan:32,pcpu,time,comm -p "$pid${kids:+,$kids}" 2>&1
      for p in $(pgrep -P $pid) $pid; do for t in /proc/$p/task/*; do
        echo "-- $t $(cat $t/comm) $(cat $t/wchan 2>/dev/null) $(cut -d' ' -f14,15 $t/stat 2>/dev/null) syscall $(cut -d' ' -f1 $t/syscall 2>/dev/null)"
        head -8 $t/stack 2>/dev/null
      done; done
      nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv 2>&1; } >"$O/$name.hung" 2>&1
    pkill -9 -P $pid 2>/dev/null; kill -9 $pid 2>/dev/null; sleep 1
  fi
  echo "$name rc $rc in $((SECONDS - t0)) s"
  if declare -F pack >/dev/null; then pack; fi
}
