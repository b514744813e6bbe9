#!/usr/bin/env bash
# Installs what the build, the tests and the benchmarks need, then builds and installs cuda_p2p
# into .venv. Idempotent: when everything is in place it takes seconds.
#
#   Debian packages  libgtest-dev, openmpi-bin, libopenmpi-dev (skipped where apt is unavailable:
#                    the C++ tests are then skipped)
#   .venv            made with --system-site-packages so an importable torch >= 2.11 is reused;
#                    torch==2.14.1 is installed only where none is importable
#   Python packages  cmake, ninja, scikit-build-core, pytest, numpy, matplotlib (only if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { printf '[setup] %s\n' "$*"; }

# --- Debian packages ----------------------------------------------------------------------------
apt_pkgs=(libgtest-dev openmpi-bin libopenmpi-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    log "cannot install ${missing[*]} (no apt-get or not root): C++ tests will be skipped"
  fi
fi

# --- virtual environment ------------------------------------------------------------------------
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv (--system-site-packages)"
  "$PY" -m venv --system-site-packages .venv
fi
VPY=$ROOT/.venv/bin/python

if ! "$VPY" - <<'PYEOF' 2>/dev/null; then
import torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
assert (major, minor) >= (2, 11), torch.__version__
PYEOF
  log "installing torch==2.14.1"
  "$VPY" -m pip install -q torch==2.14.1
fi

need=$("$VPY" - <<'PYEOF'
import importlib.util, shutil
mods = {"cmake": "cmake", "ninja": "ninja", "scikit_build_core": "scikit-build-core",
        "pytest": "pytest", "numpy": "numpy", "matplotlib": "matplotlib"}
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
stamp=build/.installed-sources
sources_hash=$(git ls-files -z --cached --others --exclude-standard \
    CMakeLists.txt pyproject.toml backend p2p_workspace ops python tests/cpp 2>/dev/null |
  xargs -0 sha1sum 2>/dev/null | sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sources_hash" ] &&
  "$VPY" -c "import cuda_p2p" 2>/dev/null; then
  log "cuda_p2p is up to date"
else
  log "building and installing cuda_p2p (CMake via scikit-build-core)"
  mkdir -p build
  "$VPY" -m pip install -q --no-build-isolation --no-deps . \
    -Ccmake.define.CUDA_P2P_BUILD_TESTS="${CUDA_P2P_BUILD_TESTS:-ON}"
  echo "$sources_hash" >"$stamp"
fi
