#!/usr/bin/env bash
# The C++ tests (docs/testing.md, "C++ tests and sanitizers"), built with sanitizers:
#
#   asan  build/asan: our code (core library, harness, tests; not libtorch) built with
#         -fsanitize=address,undefined; every ctest entry (each binary as 1-4 ranks, the
#         CUDA-semantics and thread-per-stream variants) but the test_cuda_* ones (built without
#         CUDA they only skip); GoogleTest built from third_party/googletest (so CI also proves
#         that copy builds). CUDA_P2P_ASAN_TESTS: a ctest -R regex (the quick loop's: each binary
#         once). Beside those entries, the Python tests marked asan, in both host modes, with
#         the ranks' extension (_C) from this build (--no-python: neither built nor run; the
#         quick loop's; CUDA_P2P_LONG=1, which scripts/test.sh --long sets: their long forms too).
#   tsan  build/tsan: -fsanitize=thread; the host executor tests (test_host_streams, and
#         1 rank; test_workspace with a thread per host stream, 2 ranks), the watchdog (1 rank),
#         the op order with callers on streams of their own (test_op_order, 2 ranks), the
#         mailboxes and the one-sided windows' threads (test_send_recv, test_window, 2 ranks; the
#         windows also with CUDA's semantics, where threads signal from streams of their own).
#         tests/cpp/tsan.supp silences what TSan cannot see inside the uninstrumented libtorch.
#
#   bash scripts/sanitizers.sh [--build-only] [--no-python] [asan] [tsan]
#                 (default: both; needs scripts/setup.sh's .venv; --build-only builds, runs nothing)
#
# Every finding aborts the rank (halt_on_error), which fails its ctest entry.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VPY=${CUDA_P2P_PYTHON:-$ROOT/.venv/bin/python}
[ -x "$VPY" ] || VPY=$(cat build/.python 2>/dev/null || true)
if [ ! -x "$VPY" ]; then
  echo "sanitizers: no python with torch (run scripts/setup.sh first)" >&2
  exit 1
fi
BIN=$(dirname "$VPY")
CMAKE=$BIN/cmake
[ -x "$CMAKE" ] || CMAKE=cmake
CTEST=$BIN/ctest
[ -x "$CTEST" ] || CTEST=ctest
gen=()
if [ -x "$BIN/ninja" ]; then
  gen=(-G Ninja -DCMAKE_MAKE_PROGRAM="$BIN/ninja")
elif command -v ninja >/dev/null; then
  gen=(-G Ninja)
fi
build_only=0
python_asan=1
kinds=()
for arg in "$@"; do
  case $arg in
    --build-only) build_only=1 ;;
    --no-python) python_asan=0 ;;
    *) kinds+=("$arg") ;;
  esac
done
((${#kinds[@]})) || kinds=(asan tsan)

# configure_and_build DIR SANITIZE TARGETS...: -O1 with line tables keeps the builds and runs short
# and the stacks readable; precompiled torch headers cut each file's compile time several-fold.
# A unity build (CMAKE_UNITY_BUILD: up to 8 of a library's sources compiled as one file) cuts the
# libraries' compile time by a third more (ASan: 479 -> 374 s of CPU, 4m15s -> 3m18s on 2 cores).
# It needs the names in our sources' anonymous namespaces to differ between the files of a
# library (a clash is a compile error here, which CI shows); scripts/setup.sh's main build is a
# unity build too, scripts/gpu_check.sh's compiles each file alone.
configure_and_build() {
  local dir=$1 sanitize=$2
  shift 2
  "$CMAKE" -S "$ROOT" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DPython_EXECUTABLE="$VPY" \
    -DCUDA_P2P_CUDA=OFF -DCUDA_P2P_PCH=ON -DCUDA_P2P_SANITIZE="$sanitize" \
    -DCUDA_P2P_TEST_LAUNCHER=AUTO -DCUDA_P2P_TEST_RANKS= -DCMAKE_UNITY_BUILD=ON \
    "${extra[@]}" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  "$CMAKE" --build "$dir" --target "$@" -j "$(nproc)"
}

# Entries side by side, as many ranks at a time as CUDA_P2P_CTEST_JOBS (default 4; each entry
# counts its ranks, ctest's PROCESSORS): a test's ranks mostly wait for each other, and one entry
# at a time left the cores half idle.
jobs=${CUDA_P2P_CTEST_JOBS:-4}
status=0
mkdir -p build

build_tsan() {
  extra=()
  configure_and_build build/tsan thread test_host_streams test_workspace test_watchdog \
    test_op_order test_send_recv test_window
}
# When both run, the TSan build goes on beside the ASan tests, whose ranks mostly wait for each
# other (and for the timeouts of the fault tests) and leave the cores half idle. It is a session
# of its own (setsid), as scripts/test.sh's ASan build is: with autogroup scheduling a session
# gets a share of the cores like any other's, so on a machine busy with other work the build
# takes its own share instead of the ASan tests' (docs/testing.md, "What runs beside what").
# Stopped with this script.
tsan_build_pid=""
stop_tsan_build() { [ -n "$tsan_build_pid" ] && kill -- -"$tsan_build_pid" 2>/dev/null || true; }
trap stop_tsan_build EXIT
python_modes=(synchronous cuda)
for kind in "${kinds[@]}"; do
  t0=$SECONDS
  case $kind in
    asan)
      echo "== ASan+UBSan: build/asan"
      extra=(-DCUDA_P2P_GTEST_SOURCE_DIR="$ROOT/third_party/googletest")
      # Not the test_cuda_* binaries: built without CUDA (CUDA_P2P_CUDA=OFF) they only skip.
      # shellcheck disable=SC2207
      targets=($(cd tests/cpp && ls test_*.cpp | sed 's/\.cpp$//' | grep -v '^test_cuda_'))
      # And the Python extension, for the Python tests marked asan (below).
      ((python_asan)) && targets+=(_C)
      configure_and_build build/asan address,undefined "${targets[@]}" || { status=1; continue; }
      ((build_only)) && continue
      if [[ " ${kinds[*]} " == *" tsan "* ]]; then
        setsid -w bash "$ROOT/scripts/sanitizers.sh" --build-only tsan >build/tsan.build.log 2>&1 &
        tsan_build_pid=$!
      fi
      # Leaks: libtorch's own static allocations are reported at exit and are not ours to fix.
      ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=0
      export ASAN_OPTIONS=$ASAN_OPTIONS:detect_stack_use_after_return=0
      export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      python_pids=()
      if ((python_asan)); then
        # The Python tests marked asan (tests/python/faults: ranks killed while ops are queued),
        # in each host mode, their ranks running this ASan+UBSan build of the extension: the
        # package's Python files beside it in build/asan/python, libasan preloaded into the
        # uninstrumented interpreter (and libstdc++, whose __cxa_throw ASan intercepts), so that
        # a write into freed memory is reported where it happens. Both modes beside the ctest
        # entries: their ranks mostly wait for the victim's timeout (after the entries they made
        # the stage ~20 s longer, ~45 s under load).
        rm -rf build/asan/python && mkdir -p build/asan/python &&
          cp -r python/cuda_p2p build/asan/python/ &&
          cp build/asan/_C.*.so build/asan/python/cuda_p2p/ || status=1
        for mode in "${python_modes[@]}"; do
          LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
            PYTHONPATH=$ROOT/build/asan/python CUDA_P2P_HOST_SEMANTICS=$mode \
            "$VPY" -m pytest -q -p no:cacheprovider -m asan tests/python \
            ${CUDA_P2P_LONG:+--long} >"build/asan/python-$mode.log" 2>&1 &
          python_pids+=($!)
        done
      fi
      "$CTEST" --test-dir build/asan --output-on-failure --timeout 300 -j "$jobs" \
        -R "${CUDA_P2P_ASAN_TESTS:-.}" -E '^test_cuda_' ||
        status=1
      if ((python_asan)); then
        echo "== ASan+UBSan: the Python tests marked asan (the extension built with ASan)"
        for i in "${!python_pids[@]}"; do
          wait "${python_pids[$i]}" || status=1
          echo "-- CUDA_P2P_HOST_SEMANTICS=${python_modes[$i]}"
          cat "build/asan/python-${python_modes[$i]}.log"
        done
      fi
      ;;
    tsan)
      echo "== TSan: build/tsan"
      if [ -n "$tsan_build_pid" ]; then
        tsan_built=0
        wait "$tsan_build_pid" || tsan_built=$?
        echo "(built beside the ASan tests:)"
        cat build/tsan.build.log
        ((tsan_built == 0)) || { status=1; continue; }
      else
        build_tsan || { status=1; continue; }
      fi
      ((build_only)) && continue
      TSAN_OPTIONS="suppressions=$ROOT/tests/cpp/tsan.supp:halt_on_error=1:second_deadlock_stack=1:history_size=4" \
        "$CTEST" --test-dir build/tsan --output-on-failure --timeout 300 -j "$jobs" \
        -R '^(test_host_streams_np1|test_workspace_threads_np2|test_watchdog_np1|test_op_order_np2|test_send_recv_np2|test_window_np2|test_window_cuda_semantics_np2)$' ||
        status=1
      ;;
    *)
      echo "sanitizers: unknown kind '$kind' (asan, tsan)" >&2
      exit 2
      ;;
  esac
  echo "== $kind: $((SECONDS - t0)) s"
done
exit $status
