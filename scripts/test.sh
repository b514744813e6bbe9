#!/usr/bin/env bash
# Runs every test: the C++ GoogleTest binaries (ctest, under mpirun with 1, 2 and 4 ranks), then
# the Python tests (pytest, multi-process against a Gloo reference). Installs what they need first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

VPY=$PWD/.venv/bin/python
build_dir=$("$VPY" - <<'PYEOF'
import glob, os
dirs = sorted(glob.glob("build/*/CTestTestfile.cmake"), key=os.path.getmtime)
print(os.path.dirname(dirs[-1]) if dirs else "")
PYEOF
)
status=0
if [ -n "$build_dir" ] && command -v mpirun >/dev/null; then
  echo "== C++ tests (ctest in $build_dir)"
  ctest_bin=$(dirname "$VPY")/ctest
  [ -x "$ctest_bin" ] || ctest_bin=ctest
  "$ctest_bin" --test-dir "$build_dir" --output-on-failure --timeout 300 || status=1
else
  echo "== C++ tests skipped (no GoogleTest build or no mpirun)"
fi

echo "== Python tests (pytest)"
"$VPY" -m pytest -q tests/python "$@" || status=1
exit $status
