#!/usr/bin/env bash
# Runs every test (what CI runs through .ci/run; docs/testing.md): installs what they need
# (scripts/setup.sh), then the Python linter, the Python tests (pytest, multi-process against a
# Gloo reference and plain torch), the ones whose behaviour differs on a host workspace with
# CUDA's semantics, the fault-injection suite (beside the rest), and the C++ GoogleTest binaries
# under ASan+UBSan (every binary as 1-4 ranks) and TSan (the threaded ones). It ends with one line
# per stage (wall and CPU seconds against its budget) and fails when anything failed, when the C++
# suite could not run (CUDA_P2P_ALLOW_SKIP_CPP=1 accepts that, loudly) or when a stage took more
# than 1.5 times its CPU budget (docs/testing.md, "Budgets"; over a wall budget it says so only).
#
#   bash scripts/test.sh                  CI's run
#   bash scripts/test.sh --under-load     the same with a busy loop per CPU beside it for the whole
#                                         run (wall budgets doubled): the suite must pass on a
#                                         machine busy with something else
#   bash scripts/test.sh --long           CI's run plus the long forms (soaks, the randomized and
#                                         stress runs at full size, every bench variant); not CI
#   bash scripts/test.sh --quick [ARGS]   a contributor's loop: the incremental build, the linter,
#                                         the C++ binaries once (2 ranks) and the Python tests not
#                                         marked slow (ARGS go to pytest); not CI
#   bash scripts/test.sh -- ARGS          CI's run with ARGS given to every pytest run
set -euo pipefail
cd "$(dirname "$0")/.."
mode=full
under_load=0
while (($#)); do
  case $1 in
    --quick) mode=quick ;;
    --long) mode=long ;;
    --under-load) under_load=1 ;;
    --) shift; break ;;
    *) break ;;
  esac
  shift
done
pytest_args=("$@")
if ((under_load)); then export STAGE_WALL_FACTOR=2; fi

# Budgets (seconds) for CI's run on a 2-core machine of the project's kind: wall, CPU. A stage over
# 1.5 x either fails the run (docs/testing.md, "Budgets", has the measured figures behind them).
TOTAL_WALL_BUDGET=1200
TOTAL_CPU_BUDGET=2400
# shellcheck source=scripts/stages.sh
. scripts/stages.sh

# An interrupted or finished run stops what it started beside (which ignores SIGINT).
trap stop_beside EXIT
# The machine's speed, sampled for the whole run: the CPU budgets scale with it (scripts/stages.sh).
speed_samples
if ((under_load)); then
  n=$(nproc)
  echo "== under load: $n busy loops beside the whole run"
  # shellcheck disable=SC2016
  beside load /dev/null bash -c 'for ((i = 0; i < $0; i++)); do (while :; do :; done) & done; wait' "$n"
fi

status=0
stage setup 360 480 bash scripts/setup.sh || exit 1
VPY=$(cat build/.python)

# The Python linter: every Python file of the project (third_party/ excluded in pyproject.toml). A
# lint error fails the run; the tests still run, so that one run shows both.
lint_failed=0
lint() {
  echo "== Python lint (ruff check; docs/testing.md, \"Lint\")"
  "$VPY" -m ruff check python tests bench examples scripts docs || lint_failed=1
}

# CPU per test file of each pytest run (tests/python/_cpu_report.py), for docs/testing.md's table.
export CUDA_P2P_CPU_REPORT=$PWD/$STAGE_DIR/pytest-cpu-%p.json
rm -f "$STAGE_DIR"/pytest-cpu-*.json
pytest_run() { "$VPY" -m pytest -q -p no:cacheprovider "$@" "${pytest_args[@]}"; }

# Beside the CUDA-semantics and C++ stages (docs/testing.md, "What runs beside what"): the
# fault-injection suite, whose jobs mostly wait for a process-group timeout to name a dead rank, as
# the host runs and, at the same time, its cases whose behaviour differs with CUDA's semantics.
# Started after the Python stage, whose ranks and the build beside them keep both cores busy: the
# C++ stage leaves cores idle (its ranks wait for each other), the suite's waits fit there.
faults() {
  "$VPY" -m pytest -q -p no:cacheprovider tests/python/faults "$@" >build/pytest_faults.host.log \
    2>&1 &
  local host=$! cuda=0 rc=0
  CUDA_P2P_HOST_SEMANTICS=cuda "$VPY" -m pytest -q -p no:cacheprovider -m cuda_semantics \
    tests/python/faults "$@" >build/pytest_faults.cuda.log 2>&1 || cuda=1
  wait $host || rc=1
  ((cuda)) && rc=1
  return $rc
}

if [ "$mode" = quick ]; then
  stage lint 30 30 lint
  ((lint_failed)) && status=1
  # Each C++ binary once: as 2 ranks, or as 1 where it is single-process.
  CUDA_P2P_ASAN_TESTS='_np2$|^test_(config|watchdog|event_work|quiet_teardown|pad_layout|hierarchy_agreement)_np1$' \
    stage "C++ tests, each once (ASan+UBSan)" 600 600 \
      bash scripts/sanitizers.sh --no-python asan ||
    status=1
  stage "Python tests not marked slow" 300 400 pytest_run --durations=10 -m "not slow" \
    tests/python || status=1
  stage_report || true
  ((lint_failed)) && echo "!!! lint FAILED: ruff check found the errors listed above"
  echo "== quick run $( ((status == 0)) && echo passed || echo FAILED); the full run is" \
    "bash scripts/test.sh"
  exit $status
fi

long=()
if [ "$mode" = long ]; then
  long=(--long)
  export CUDA_P2P_LONG=1  # scripts/sanitizers.sh's Python tests marked asan
fi

# The ASan+UBSan build beside the Python stages: their ranks leave about half of two cores idle
# (they wait for each other and for timeouts), and the C++ stage then starts with its tests
# (docs/testing.md, "What runs beside what"). Started with setsid, it is a session of its own, so
# on a kernel with autogroup scheduling (Debian's) it gets a share like any other session's and
# its nice value orders it only among its own processes; nice 19 matters where autogroup is off.
beside "ASan+UBSan build (nice 19)" build/asan.beside.log \
  nice -n 19 bash scripts/sanitizers.sh --build-only asan

stage lint 30 30 lint

echo "== Python tests (pytest)"
stage "Python tests" 720 1200 pytest_run --durations=15 tests/python --ignore tests/python/faults \
  "${long[@]}" || status=1

export -f faults
export VPY
beside "fault injection, both modes" /dev/null bash -c 'faults "$@"' faults "${long[@]}" \
  "${pytest_args[@]}"

# The tests marked cuda_semantics (those whose behaviour differs: async errors, mismatches, queued
# ops, failures) once more on a host workspace that behaves as the CUDA one (NOTE [Host device
# with CUDA's semantics] in p2p_workspace/host/host_device.hpp): ops return queued, released waits
# let their streams run on, a mismatch fails the group.
echo "== Python tests with CUDA's semantics (CUDA_P2P_HOST_SEMANTICS=cuda, -m cuda_semantics)"
CUDA_P2P_HOST_SEMANTICS=cuda stage "Python tests, CUDA's semantics" 120 120 pytest_run \
  --durations=5 -m cuda_semantics tests/python --ignore tests/python/faults "${long[@]}" ||
  status=1

# The C++ tests (scripts/sanitizers.sh): the ASan+UBSan build (done beside the Python stages:
# what is left of it, if anything, at the normal priority), every binary under it (1-4 ranks, the
# CUDA-semantics and thread-per-stream variants) with the TSan build beside, the Python tests
# marked asan on that build, then the threaded binaries under TSan. A failed build beside is built
# again here, where its errors show.
pgid=$(cat "$STAGE_DIR/ASan+UBSan build (nice 19).pid" 2>/dev/null || true)
[ -n "$pgid" ] && renice -n 0 -g "$pgid" >/dev/null 2>&1 || true  # as root: the rest at once
join_beside "ASan+UBSan build (nice 19)" 720 450 || true
echo "== the ASan+UBSan build beside the Python stages:"
tail -3 build/asan.beside.log
echo "== C++ tests (scripts/sanitizers.sh)"
cpp_status=0
stage "C++ tests (ASan+UBSan, TSan)" 360 450 bash scripts/sanitizers.sh || cpp_status=1

join_beside "fault injection, both modes" 360 150 || status=1
echo "== Python tests: tests/python/faults (run beside the above), as the host runs"
cat build/pytest_faults.host.log
echo "== the same cases whose behaviour differs, with CUDA_P2P_HOST_SEMANTICS=cuda"
cat build/pytest_faults.cuda.log

if ((cpp_status)) && [ ! -x build/asan/tests/cpp/test_backend ]; then
  echo "!!! SKIPPED: the C++ tests could not be built (their stage's output above)"
  if [ "${CUDA_P2P_ALLOW_SKIP_CPP:-0}" = 1 ]; then
    echo "!!! accepted because CUDA_P2P_ALLOW_SKIP_CPP=1"
    cpp_status=0
  fi
fi
((cpp_status)) && status=1

stage_report || status=1
"$VPY" scripts/cpu_table.py "$STAGE_DIR"/pytest-cpu-*.json >"$STAGE_DIR/pytest-cpu.md" ||
  true
echo "(CPU per test file: $STAGE_DIR/pytest-cpu.md)"
if ((lint_failed)); then
  echo "!!! lint FAILED: ruff check found the errors listed above"
  status=1
fi
exit $status
