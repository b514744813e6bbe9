#!/usr/bin/env bash
# The demo: local CPU ranks, cuda_p2p against Gloo measured in the same run; prints a table and
# writes bench/results/collectives.{json,png}. Arguments go to bench/bench_collectives.py, e.g.
#
#   bash scripts/bench.sh                         # 2 and 4 ranks, 8 B .. 16 MiB (about 2 minutes)
#   bash scripts/bench.sh --world-sizes 4
#   bash scripts/bench.sh --full --algos          # every algorithm, suggested thresholds
#   bash scripts/bench.sh --full                  # 8 B .. 64 MiB, powers of 2 (several minutes)
#   bash scripts/bench.sh --env CUDA_P2P_DISABLE_WORKSPACE=1
#   bash scripts/bench.sh --hosts 2 --world-sizes 4   # hierarchical (2 simulated hosts) vs flat Gloo
#   bash scripts/bench.sh --zero-copy             # + zero-copy (symmetric heap) vs staged
#   bash scripts/bench.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh   # installs and builds what is missing; seconds when everything is in place
exec .venv/bin/python bench/bench_collectives.py "$@"
