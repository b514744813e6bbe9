#!/usr/bin/env bash
# Installs what the build, the tests and the benchmarks need, then builds and installs cuda_p2p
# into .venv. Idempotent: when everything is in place it takes seconds.
#
#   Debian packages  libgtest-dev, openmpi-bin, libopenmpi-dev, iproute2, where apt works (root,
#                    online).
#                    Without them nothing is skipped: GoogleTest is built from
#                    third_party/googletest and ctest starts the ranks with tests/cpp/launch.py.
#   Python           .venv made with --system-site-packages so an importable torch >= 2.11 is
#                    reused; torch==2.14.1 is installed only where none is importable. Where the
#                    python given ($PYTHON, else python3) is itself a virtual environment with
#                    torch (the GPU machines), it is used as it is: a venv made from a venv would
#                    not see its packages. build/.python records the interpreter chosen.
#   Python packages  cmake, ninja, scikit-build-core, pytest, ruff (pinned: its rules change between
#                    releases), numpy, matplotlib (only if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { printf '[setup] %s\n' "$*"; }

# --- Debian packages ----------------------------------------------------------------------------
# iproute2: network namespaces and tc for bench.sh --link (tests/python/clients/test_bench.py).
apt_pkgs=(libgtest-dev openmpi-bin libopenmpi-dev iproute2)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] &&
    { log "installing Debian packages: ${missing[*]}"; apt-get update -qq >/dev/null 2>&1; } &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; then
    :
  else
    log "could not install ${missing[*]} (no apt-get, not root, or offline): GoogleTest is" \
      "built from third_party/googletest; without mpirun ctest starts the ranks with" \
      "tests/cpp/launch.py"
  fi
fi

# --- Python -------------------------------------------------------------------------------------
PY=${PYTHON:-python3}
mkdir -p build
if [ ! -x .venv/bin/python ] && "$PY" - <<'PYEOF' 2>/dev/null; then
import sys, torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
assert sys.prefix != sys.base_prefix and (major, minor) >= (2, 11)
PYEOF
  VPY=$("$PY" -c 'import sys; print(sys.executable)')
  log "using $VPY as it is (a virtual environment with torch already)"
else
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv (--system-site-packages)"
    "$PY" -m venv --system-site-packages .venv
  fi
  VPY=$ROOT/.venv/bin/python
fi
echo "$VPY" >build/.python

if ! "$VPY" - <<'PYEOF' 2>/dev/null; then
import torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
assert (major, minor) >= (2, 11), torch.__version__
PYEOF
  log "installing torch==2.14.1"
  "$VPY" -m pip install -q torch==2.14.1
fi

# -I: not the current folder on sys.path, where a folder named like a package (cmake/) would be
# taken for it.
need=$("$VPY" -I - <<'PYEOF'
import importlib.util, shutil
mods = {"cmake": "cmake", "ninja": "ninja", "scikit_build_core": "scikit-build-core",
        "pytest": "pytest", "ruff": "ruff==0.17.6", "numpy": "numpy", "matplotlib": "matplotlib"}
print(" ".join(pkg for mod, pkg in mods.items() if importlib.util.find_spec(mod) is None))
PYEOF
)
if [ -n "$need" ]; then
  log "installing Python packages: $need"
  # shellcheck disable=SC2086
  "$VPY" -m pip install -q $need
fi

# --- build and install cuda_p2p -----------------------------------------------------------------
# Rebuilt only when a source file changed since the last install (or the install is missing).
# Without the C++ test binaries (CUDA_P2P_BUILD_TESTS=ON adds them): scripts/test.sh runs them
# from the sanitizer builds (scripts/sanitizers.sh).
stamp=build/.installed-sources
sources_hash=$(git ls-files -z --cached --others --exclude-standard \
    CMakeLists.txt pyproject.toml backend p2p_workspace ops python tests/cpp third_party \
    2>/dev/null |
  xargs -0 sha1sum 2>/dev/null | sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sources_hash" ] &&
  "$VPY" -c "import cuda_p2p" 2>/dev/null; then
  log "cuda_p2p is up to date"
else
  log "building and installing cuda_p2p (CMake via scikit-build-core)"
  # Precompiled torch headers for the C++ sources (CUDA_P2P_PCH), and a unity build (up to 8 of
  # a target's sources compiled as one file; CUDA_P2P_UNITY=OFF compiles each file alone): 518 ->
  # 338 s of CPU, 4m36s -> 3m02s on 2 cores (the timings: docs/testing.md).
  "$VPY" -m pip install -q --no-build-isolation --no-deps . \
    -Ccmake.define.CUDA_P2P_BUILD_TESTS="${CUDA_P2P_BUILD_TESTS:-OFF}" \
    -Ccmake.define.CUDA_P2P_PCH="${CUDA_P2P_PCH:-ON}" \
    -Ccmake.define.CMAKE_UNITY_BUILD="${CUDA_P2P_UNITY:-ON}"
  echo "$sources_hash" >"$stamp"
fi
