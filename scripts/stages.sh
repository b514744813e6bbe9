# Stage accounting for scripts/test.sh (sourced): each stage's wall time and CPU time, its budget,
# and a verdict when a stage takes more than 1.5 times its budget (docs/testing.md, "Budgets"):
# over its CPU budget fails the run (the work grew); over its wall budget only says so (a slower
# or busier machine stretches wall time alone, and must not turn a run red).
#
#   stage NAME WALL_S CPU_S cmd...   runs cmd in this shell, records its wall and CPU
#   beside NAME LOG cmd...           starts cmd outside this shell's children (setsid), so its CPU
#                                    never lands in a foreground stage; cmd must be a program
#   join_beside NAME WALL_S CPU_S    waits for a `beside` stage, records it; returns its status
#   stop_beside                      kills every `beside` stage still running (an EXIT trap)
#   speed_samples                    starts scripts/cpu_speed.py beside the run: the machine's
#                                    speed, sampled every 10 s
#   stage_report                     one line per stage and the total; non-zero when over a CPU
#                                    budget (scaled by the machine's speed)
#
# CPU is user + system time of the stage's processes and of every process they waited for, read
# from /proc (a process that is never waited for, re-parented to init, is not counted). With
# STAGE_WALL_FACTOR (scripts/test.sh --under-load sets 2) the wall budgets are multiplied by it.
#
# The CPU budgets hold for a machine at full speed: one whose speed samples (scripts/cpu_speed.py,
# CPU seconds of a fixed piece of work) have a median of CPU_SPEED_REF seconds. A slower machine's
# budgets are multiplied by median / CPU_SPEED_REF, at most by CPU_SPEED_MAX_FACTOR: its stages
# take more CPU seconds for the same work, which is not growth (docs/testing.md, "Budgets").
CPU_SPEED_REF=${CPU_SPEED_REF:-0.060}
CPU_SPEED_MAX_FACTOR=${CPU_SPEED_MAX_FACTOR:-2}

STAGE_DIR=${STAGE_DIR:-build/stages}
STAGE_WALL_FACTOR=${STAGE_WALL_FACTOR:-1}
_clk_tck=$(getconf CLK_TCK)
_stage_rows=()
_stage_over=()
_stage_slow=()
_stage_wall_budget=0
_stage_cpu_budget=0
_stage_cpu_total=0
_stage_cpu_names=()
_stage_cpu_used=()
_stage_cpu_budgets=()
_stage_t0=$EPOCHREALTIME
mkdir -p "$STAGE_DIR"

# cpu_ticks PID: user + system ticks of PID and of the children it has waited for.
cpu_ticks() {
  local s
  s=$(<"/proc/$1/stat")
  s=${s##*) }  # the command name may hold spaces: fields from the state on
  local -a f=($s)
  echo $((f[11] + f[12] + f[13] + f[14]))
}

# seconds_since T0: whole seconds from $EPOCHREALTIME value T0 to now.
seconds_since() {
  local now=$EPOCHREALTIME
  echo $(((${now/./} - ${1/./}) / 1000000))
}

_record() {  # NAME WALL CPU WALL_BUDGET CPU_BUDGET
  local name=$1 wall=$2 cpu=$3 wb=$(($4 * STAGE_WALL_FACTOR)) cb=$5
  _stage_rows+=("$(printf '%-34s %6d %6d   %6d %6d' "$name" "$wall" "$cpu" "$wb" "$cb")")
  _stage_wall_budget=$((_stage_wall_budget + wb))
  _stage_cpu_budget=$((_stage_cpu_budget + cb))
  _stage_cpu_total=$((_stage_cpu_total + cpu))
  if ((wall * 2 > wb * 3)); then
    _stage_slow+=("$name took $wall s of wall time, more than 1.5 x its budget of $wb s")
  fi
  _stage_cpu_names+=("$name")
  _stage_cpu_used+=("$cpu")
  _stage_cpu_budgets+=("$cb")
}

speed_samples() {
  rm -f "$STAGE_DIR/cpu_speed.txt"
  beside "CPU speed samples" /dev/null python3 scripts/cpu_speed.py --every 10 \
    --out "$STAGE_DIR/cpu_speed.txt"
}

# speed_factor: the CPU budgets' factor in hundredths (100: a machine at full speed), and why, from
# the samples' median.
speed_factor() {
  local f="$STAGE_DIR/cpu_speed.txt" median n factor
  n=$(grep -c . "$f" 2>/dev/null || true)
  if [ -z "$n" ] || ((n == 0)); then
    echo "100 no speed samples: the budgets as they are"
    return
  fi
  median=$(sort -n "$f" | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  factor=$(awk -v m="$median" -v r="$CPU_SPEED_REF" -v x="$CPU_SPEED_MAX_FACTOR" \
    'BEGIN {f = m / r; if (f < 1) f = 1; if (f > x) f = x; printf "%d", f * 100 + 0.5}')
  echo "$factor the median of $n speed samples, $median s, against $CPU_SPEED_REF s at full speed"
}

stage() {
  local name=$1 wb=$2 cb=$3
  shift 3
  local w0=$EPOCHREALTIME c0 rc=0
  c0=$(cpu_ticks $$)
  "$@" || rc=$?
  _record "$name" "$(seconds_since "$w0")" $((($(cpu_ticks $$) - c0) / _clk_tck)) "$wb" "$cb"
  return $rc
}

beside() {
  local name=$1 log=$2
  shift 2
  rm -f "$STAGE_DIR/$name".{pid,done}
  # The inner bash writes its pid (its own process group: setsid), runs the command as its child
  # and writes "status wall cpu" when it ends; the subshell around it exits at once, so this shell
  # never waits for it.
  # shellcheck disable=SC2016
  (setsid bash -c 'echo $$ >"$0.pid"; w0=${EPOCHREALTIME/./}; rc=0; "$@" || rc=$?
    s=$(</proc/$$/stat); s=${s##*) }; f=($s); w1=${EPOCHREALTIME/./}
    echo "$rc $(((w1 - w0) / 1000000)) $(((f[11] + f[12] + f[13] + f[14]) / $(getconf CLK_TCK)))" \
      >"$0.tmp" && mv "$0.tmp" "$0.done"' "$STAGE_DIR/$name" "$@" >"$log" 2>&1 </dev/null &)
}

join_beside() {
  local name=$1 wb=$2 cb=$3 pid=""
  while [ ! -f "$STAGE_DIR/$name.done" ]; do
    [ -n "$pid" ] || pid=$(cat "$STAGE_DIR/$name.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && [ ! -f "$STAGE_DIR/$name.done" ]; then
      echo "!!! $name: its process $pid ended without a result"
      _record "$name" 0 0 "$wb" "$cb"
      return 1
    fi
    sleep 1
  done
  local rc wall cpu
  read -r rc wall cpu <"$STAGE_DIR/$name.done"
  _record "$name" "$wall" "$cpu" "$wb" "$cb"
  return "$rc"
}

stop_beside() {
  local f pid
  for f in "$STAGE_DIR"/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    [ -n "$pid" ] && kill -- -"$pid" 2>/dev/null || true
    rm -f "$f"
  done
}

stage_report() {
  local total_wall factor why i
  total_wall=$(seconds_since "$_stage_t0")
  read -r factor why < <(speed_factor)
  for i in "${!_stage_cpu_names[@]}"; do
    if ((_stage_cpu_used[i] * 200 > _stage_cpu_budgets[i] * factor * 3)); then
      _stage_over+=("${_stage_cpu_names[i]} took ${_stage_cpu_used[i]} s of CPU, more than 1.5 x its budget of $((_stage_cpu_budgets[i] * factor / 100)) s")
    fi
  done
  echo "== stages (seconds; docs/testing.md, \"Budgets\"):"
  printf '   %-34s %6s %6s   %6s %6s\n' stage wall CPU "wall" "CPU"
  printf '   %-34s %6s %6s   %6s %6s\n' "" "" "" budget budget
  local row
  for row in "${_stage_rows[@]}"; do echo "   $row"; done
  printf '   %-34s %6d %6d   %6d %6d\n' "total" "$total_wall" "$_stage_cpu_total" \
    "$((TOTAL_WALL_BUDGET * STAGE_WALL_FACTOR))" "$TOTAL_CPU_BUDGET"
  echo "   CPU budgets x $((factor / 100)).$(printf '%02d' $((factor % 100))) for this machine's" \
    "speed: $why (scripts/cpu_speed.py)"
  if ((total_wall * 2 > TOTAL_WALL_BUDGET * STAGE_WALL_FACTOR * 3)); then
    _stage_slow+=("the whole run took $total_wall s, more than 1.5 x its budget")
  fi
  if ((_stage_cpu_total * 200 > TOTAL_CPU_BUDGET * factor * 3)); then
    _stage_over+=("the whole run took $_stage_cpu_total s of CPU, more than 1.5 x its budget of $((TOTAL_CPU_BUDGET * factor / 100)) s")
  fi
  local o
  for o in "${_stage_slow[@]}"; do
    echo "!!! SLOW: $o; not a failure: wall time grows on a slower or busier machine (load" \
      "average $(cut -d' ' -f1-3 /proc/loadavg); docs/testing.md, \"Budgets\")"
  done
  if ((${#_stage_over[@]})); then
    for o in "${_stage_over[@]}"; do
      echo "!!! OVER BUDGET: $o (docs/testing.md, \"Budgets\": find what grew, or move it to --long)"
    done
    return 1
  fi
}
