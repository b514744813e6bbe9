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
#   bash scripts/bench.sh --compare               # the comparisons below, one after the other
#   bash scripts/bench.sh --help
#
# --compare runs, each into bench/results/compare_<name>.{json,png} (about 13 minutes):
#   deepspeed     all_reduce on 2 and 4 ranks, 8 B .. 16 MiB: dist.all_reduce and the dispatcher op
#                 beside DeepSpeed's shm all-reduce (a column only when deepspeed is installed:
#                 .venv/bin/pip install deepspeed; the bench builds its CPU comm op)
#   deepspeed_b2b the same from 8 B to 64 KiB, 200 back-to-back ops per sample (--batch 200):
#                 what a decode loop sees, without each sample's cold start
#   hierarchical  4 ranks on 2 simulated hosts, hierarchical against the flat wrapped Gloo
#   zero_copy     all-gather, reduce-scatter, all-reduce, broadcast on 2 and 4 ranks: symmetric inputs
#                 (cuda_p2p.empty) against the staged path
#   fused         the fused ops at M=K=1024, N=64..512 fp32, 2 and 4 ranks: fused, "auto" and the
#                 unfused pair (bench/results/fused-small-n-*.json; no plot)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh   # installs and builds what is missing; seconds when everything is in place
if [ "${1:-}" != "--compare" ]; then
  exec .venv/bin/python bench/bench_collectives.py "$@"
fi
shift
out=bench/results
run() {
  local name=$1
  shift
  echo
  echo "=== $name: $*"
  .venv/bin/python "$@" || { echo "=== $name failed" >&2; status=1; }
}
status=0
run deepspeed bench/bench_collectives.py --world-sizes 2 4 --collectives all_reduce \
  --peers auto --json "$out/compare_deepspeed.json" --plot "$out/compare_deepspeed.png" "$@"
run deepspeed_b2b bench/bench_collectives.py --world-sizes 2 4 --collectives all_reduce \
  --sizes 8 1K 4K 16K 64K --batch 200 --peers auto --json "$out/compare_deepspeed_b2b.json" \
  --plot "$out/compare_deepspeed_b2b.png" "$@"
run hierarchical bench/bench_collectives.py --world-sizes 4 --hosts 2 \
  --json "$out/compare_hierarchical.json" --plot "$out/compare_hierarchical.png" "$@"
run zero_copy bench/bench_collectives.py --world-sizes 2 4 --zero-copy \
  --collectives all_gather_into_tensor reduce_scatter_tensor all_reduce broadcast \
  --json "$out/compare_zero_copy.json" --plot "$out/compare_zero_copy.png" "$@"
run fused bench/bench_fused.py --small-n 64 128 256 512 --world-sizes 2 4 --dtypes float32 \
  --out-dir "$out"
exit $status
