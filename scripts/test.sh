#!/usr/bin/env bash
# Runs every test: the Python linter (ruff, pyproject.toml's [tool.ruff]), the C++ GoogleTest
# binaries (ctest: each binary as 1, 2 and 4 ranks, under mpirun or tests/cpp/launch.py), the
# Python tests (pytest, multi-process against a Gloo reference), then the C++ tests under
# ASan+UBSan and TSan (scripts/sanitizers.sh). Installs what they need first. Exits non-zero
# when anything fails - including when the C++ suite cannot run at all
# (CUDA_P2P_ALLOW_SKIP_CPP=1 accepts that, loudly). CUDA_P2P_SANITIZERS=0 leaves the sanitizer
# builds out (CI runs them). The sanitizer builds and tests/python/test_faults.py run beside the
# rest (below; docs/testing.md, "What runs beside what").
#
# `bash scripts/test.sh --quick [pytest args]`: a contributor's loop (docs/testing.md, "The quick
# loop"): the incremental build, the linter, each C++ binary once (2 ranks), and the Python tests
# not marked slow (tests/python/conftest.py), without the sanitizers. Not CI: the full run is.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
bash scripts/setup.sh
# Each stage's wall time, printed at the end (CI's budget: docs/testing.md, "What runs beside
# what (CI time)").
times=("setup: $SECONDS s")
mark=$SECONDS
stage_done() {
  times+=("$1: $((SECONDS - mark)) s")
  mark=$SECONDS
}

VPY=$(cat build/.python 2>/dev/null || echo "$PWD/.venv/bin/python")
# The scikit-build-core build (build/<wheel tag>), not the sanitizer or gpu_check builds.
build_dir=$("$VPY" - <<'PYEOF'
import glob, os
dirs = [d for d in glob.glob("build/*/CTestTestfile.cmake")
        if os.path.basename(os.path.dirname(d)) not in ("asan", "tsan", "gpu_check")]
dirs.sort(key=os.path.getmtime)
print(os.path.dirname(dirs[-1]) if dirs else "")
PYEOF
)
status=0
skipped=()
# Every Python file of the project (third_party/ is excluded in pyproject.toml). A lint error fails
# the run; the tests still run, so that one run shows both.
lint_failed=0
lint() {
  echo "== Python lint (ruff check; docs/testing.md, \"Lint\")"
  if ! "$VPY" -m ruff check python tests bench examples scripts docs; then
    lint_failed=1
    status=1
  fi
}
lint_verdict() {
  if ((lint_failed)); then echo "!!! lint FAILED: ruff check found the errors listed above"; fi
}
if ((quick)); then
  t0=$SECONDS
  lint
  ctest_bin=$(dirname "$VPY")/ctest
  [ -x "$ctest_bin" ] || ctest_bin=ctest
  if [ -n "$build_dir" ]; then
    # Each binary once: as 2 ranks, or as 1 where it is single-process (tests/cpp/CMakeLists.txt).
    quick_cpp='_np2$|^test_(config|watchdog|event_work|quiet_teardown|pad_layout|hierarchy_agreement)_np1$'
    echo "== C++ tests, each binary once (ctest -R '$quick_cpp' in $build_dir)"
    "$ctest_bin" --test-dir "$build_dir" --output-on-failure --timeout 300 -R "$quick_cpp" \
      -E _threads_ ||
      status=1
  else
    echo "!!! no ctest build: the C++ tests were not run"
    status=1
  fi
  echo "== Python tests not marked slow (pytest -m 'not slow')"
  "$VPY" -m pytest -q -p no:cacheprovider --durations=10 -m "not slow" tests/python "$@" ||
    status=1
  lint_verdict
  echo "== quick run: $((SECONDS - t0)) s after setup ($( ((status == 0)) && echo passed ||
    echo FAILED)); the full run is bash scripts/test.sh"
  exit $status
fi
# The sanitizer builds (CPU-bound) go on in the background while the tests below run: the ranks
# wait on each other, for timeouts and for subprocesses much of the time, and on a 2-core machine
# pytest alone keeps the CPUs ~73% busy. SCHED_IDLE (chrt --idle) gives the builds mostly CPU time
# nothing else wants; the tests still slow down some (a polling rank's sched_yield can hand the
# core to a compiler until the next tick; the timings: docs/testing.md). Its log:
# build/sanitizers_build.log; scripts/sanitizers.sh below finishes whatever is left of the builds
# and reports any error.
sanitizer_build=
if [ "${CUDA_P2P_SANITIZERS:-1}" = 1 ]; then
  mkdir -p build
  idle=()
  if command -v chrt >/dev/null && chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0); fi
  # A process group of its own (setsid): an interrupted run takes the whole build down with it.
  setsid "${idle[@]}" bash scripts/sanitizers.sh --build-only >build/sanitizers_build.log 2>&1 &
  sanitizer_build=$!
fi
faults=
# An interrupted run stops what it started in the background (which ignores SIGINT).
# (Each kill ends in `|| true`: under set -e a failing last command of the trap would make the
# script's exit status 1 after a run that passed.)
stop_background() {
  if [ -n "$sanitizer_build" ]; then kill -- -"$sanitizer_build" 2>/dev/null || true; fi
  if [ -n "$faults" ]; then kill "$faults" 2>/dev/null || true; fi
}
trap stop_background EXIT
lint
stage_done "lint"
if [ -n "$build_dir" ]; then
  echo "== C++ tests (ctest in $build_dir)"
  ctest_bin=$(dirname "$VPY")/ctest
  [ -x "$ctest_bin" ] || ctest_bin=ctest
  "$ctest_bin" --test-dir "$build_dir" --output-on-failure --timeout 300 || status=1
  stage_done "C++ tests"
else
  skipped+=("C++ tests: no ctest build (CUDA_P2P_BUILD_TESTS=OFF?)")
fi

echo "== Python tests (pytest)"
if (($#)); then
  "$VPY" -m pytest -q --durations=15 tests/python "$@" || status=1
else
  # tests/python/test_faults.py runs beside the rest, in a pytest of its own: its jobs spend most
  # of their ~160 s waiting for a 10 s process-group timeout to name a dead rank, so the other
  # tests lose little CPU to it. Its output follows the main run's.
  # It runs twice: as the host runs, then with CUDA's semantics (below).
  faults_log=build/pytest_faults.log
  (
    "$VPY" -m pytest -q -p no:cacheprovider tests/python/test_faults.py &&
      echo "== tests/python/test_faults.py with CUDA_P2P_HOST_SEMANTICS=cuda" &&
      CUDA_P2P_HOST_SEMANTICS=cuda "$VPY" -m pytest -q -p no:cacheprovider \
        tests/python/test_faults.py
  ) >"$faults_log" 2>&1 &
  faults=$!
  "$VPY" -m pytest -q --durations=15 tests/python --ignore tests/python/test_faults.py ||
    status=1
  stage_done "Python tests"
  # The suites of the collectives and the fused ops again on a host workspace that behaves as the
  # CUDA one (NOTE [Host device with CUDA's semantics] in p2p_workspace/host/host_device.hpp): ops
  # return queued, released waits let their streams run on, a mismatch fails the group. (Not the
  # suites of the host's own paths: the inline all-reduce, counted "all_reduce.inline", is the
  # synchronous host's.)
  echo "== Python tests with CUDA's semantics (CUDA_P2P_HOST_SEMANTICS=cuda)"
  CUDA_P2P_HOST_SEMANTICS=cuda "$VPY" -m pytest -q -p no:cacheprovider --durations=5 \
    tests/python/test_ws_collectives.py tests/python/test_collectives.py \
    tests/python/test_fused_ops.py || status=1
  stage_done "Python tests with CUDA's semantics"
  wait "$faults" || status=1
  stage_done "test_faults.py twice (beside; after the Python tests)"
  echo "== Python tests: tests/python/test_faults.py (run beside the above)"
  cat "$faults_log"
fi

if [ "${CUDA_P2P_SANITIZERS:-1}" = 1 ]; then
  echo "== C++ tests under sanitizers (scripts/sanitizers.sh)"
  t0=$SECONDS
  wait "$sanitizer_build" || true  # its errors show again in the run below
  echo "(the background build ended $((SECONDS - t0)) s after the tests above)"
  bash scripts/sanitizers.sh || status=1
  stage_done "sanitizers"
else
  echo "== sanitizers left out (CUDA_P2P_SANITIZERS=0)"
fi

echo "== stages: ${times[*]/%/;} total $SECONDS s"
lint_verdict
if ((${#skipped[@]})); then
  echo
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  for s in "${skipped[@]}"; do echo "!!! SKIPPED: $s"; done
  if [ "${CUDA_P2P_ALLOW_SKIP_CPP:-0}" = 1 ]; then
    echo "!!! accepted because CUDA_P2P_ALLOW_SKIP_CPP=1"
  else
    echo "!!! this is a failure (CUDA_P2P_ALLOW_SKIP_CPP=1 accepts it)"
    status=1
  fi
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
fi
exit $status
