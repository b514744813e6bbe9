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
#   bash scripts/bench.sh --host-sizes 3 1 --world-sizes 4  # the same on hosts of 3 and 1 ranks
#   bash scripts/bench.sh --zero-copy             # + zero-copy (symmetric heap) vs staged
#   bash scripts/bench.sh --fsdp                  # FSDP2 step: Gloo vs staged vs symmetric buffers
#   bash scripts/bench.sh --pipeline              # GPipe / 1F1B step: Gloo vs cuda_p2p send/recv
#   bash scripts/bench.sh --hosts 2 --link 10gbit # 2 hosts in network namespaces, a shaped link
#   bash scripts/bench.sh --compare               # the comparisons below, one after the other
#   bash scripts/bench.sh --help
#
# --compare runs, each into bench/results/compare_<name>.{json,png} (about 15 minutes):
#   deepspeed     all_reduce on 2 and 4 ranks, 8 B .. 16 MiB: dist.all_reduce and the dispatcher op
#                 beside DeepSpeed's shm all-reduce (a column only when deepspeed is installed:
#                 .venv/bin/pip install deepspeed; the bench builds its CPU comm op)
#   deepspeed_b2b the same from 8 B to 64 KiB, 200 back-to-back ops per sample (--batch 200):
#                 what a decode loop sees, without each sample's cold start
#   hierarchical  4 ranks on 2 simulated hosts, hierarchical against the flat wrapped Gloo
#   hierarchical_uneven  the all-reduce on hosts of 3 and 1 ranks (--host-sizes 3 1): the
#                 leaders carry the data
#   zero_copy     all-gather, reduce-scatter, all-reduce, broadcast on 2 and 4 ranks: symmetric inputs
#                 (cuda_p2p.empty) against the staged path
#   fused         the fused ops at M=K=1024, N=64..512 fp32, 2 and 4 ranks: fused, "auto" and the
#                 unfused pair (bench/results/fused-small-n-*.json, the latest copied to
#                 compare_fused.json; no plot)
# Then bench/compare_results.py lists every ratio that got worse by more than 10% than the
# committed baselines (bench/baselines/compare_*.json: the envelope of several runs of this on a
# 2-core machine, bench/README.md "The regression guard"); exit status 3 when one did.
#
# --fsdp runs bench/bench_fsdp.py (its arguments follow): an FSDP2 step of a few Linear layers on
# 2 and 4 ranks, on Gloo, on cuda_p2p with staged buffers and with buffers in the symmetric heap
# (bench/results/fsdp.{json,png}).
#
# --pipeline runs bench/bench_pipeline.py (its arguments follow): a torch.distributed.pipelining
# training step (GPipe and 1F1B, a stage per rank) on 2 and 4 ranks, its send/recv on Gloo and on
# cuda_p2p's mailboxes (bench/results/pipeline.{json,png}).
#
# --windows runs bench/bench_windows.py (its arguments follow): a ping-pong between pairs of ranks
# through one-sided windows (put + signal, wait_signal) and through send/recv on the same group,
# 8 B to 16 MiB, as a ratio (bench/results/windows.json; docs/windows.md).
#
# --link RATE (with --hosts 2; RATE as tc writes it: 10gbit, 25gbit, 100gbit) puts each simulated
# host's ranks in a network namespace of its own, joined by a veth pair whose two ends are shaped
# to RATE with tc's tbf (netem is not in every kernel), so that bytes between hosts cost what such
# a link would; bytes within a host stay in its namespace. It measures what the link carries (one
# TCP stream, 64 MiB), then prints hierarchical vs flat Gloo per collective and size on 2x2 and 2x3
# ranks (--world-sizes to change) into bench/results/link_RATE.{json,png}. It needs root and
# iproute2 (ip, tc); without them it says so and exits 0. The namespaces, the veth pair and its
# addresses (10.231.0.1/24, 10.231.0.2/24, inside the namespaces only) are removed at the end,
# whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

link=""
args=()
while (($#)); do
  case $1 in
    --link) link=${2:?--link needs a rate (e.g. 10gbit)}; shift 2 ;;
    --link=*) link=${1#--link=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- ${args[@]+"${args[@]}"}

if [ -n "$link" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "bench.sh --link: skipped: it needs root and iproute2 (ip, tc) to make network" \
      "namespaces and shape their link (uid $(id -u); ip: $(command -v ip || echo missing)," \
      "tc: $(command -v tc || echo missing))"
    exit 0
  fi
  [[ $link =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]] ||
    { echo "bench.sh --link: expected a rate like 10gbit, 25gbit or 100gbit, got '$link'" >&2; exit 2; }
  hosts=""
  for ((i = 1; i <= $#; i++)); do
    if [ "${!i}" = --hosts ]; then j=$((i + 1)); hosts=${!j:-}; fi
  done
  [ "$hosts" = 2 ] || { echo "bench.sh --link: needs --hosts 2 (two namespaces, one link)" >&2; exit 2; }
fi

bash scripts/setup.sh   # installs and builds what is missing; seconds when everything is in place
if [ "${1:-}" = "--fsdp" ]; then
  shift
  exec .venv/bin/python bench/bench_fsdp.py "$@"
fi
if [ "${1:-}" = "--pipeline" ]; then
  shift
  exec .venv/bin/python bench/bench_pipeline.py "$@"
fi
if [ "${1:-}" = "--windows" ]; then
  shift
  exec .venv/bin/python bench/bench_windows.py "$@"
fi
if [ -n "$link" ]; then
  tag="cp2p$$"
  ns0="$tag-h0" ns1="$tag-h1"
  cleanup() {
    ip netns del "$ns0" 2>/dev/null || true
    ip netns del "$ns1" 2>/dev/null || true   # its end of the veth pair goes with it
  }
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  if ! ip netns add "$ns0" 2>/dev/null || ! ip netns add "$ns1" 2>/dev/null; then
    echo "bench.sh --link: skipped: this machine refuses network namespaces (ip netns add)"
    exit 0
  fi
  ip link add v0 netns "$ns0" type veth peer name v1 netns "$ns1"
  # rate bytes/s / 1000: a millisecond's worth of burst (at least 64 KiB), so that the rate holds
  # from a single message on; packets wait up to 200 ms in the queue rather than being dropped.
  burst=$(python3 -c "import re; m = re.match(r'([0-9.]+)([kmg]?)bit', '$link'); \
print(max(65536, int(float(m[1]) * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9}[m[2]] / 8 / 1000)))")
  for i in 0 1; do
    ns=$tag-h$i
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "v$i" mtu 9000 up
    ip -n "$ns" addr add "10.231.0.$((i + 1))/24" dev "v$i"
    ip netns exec "$ns" tc qdisc add dev "v$i" root tbf rate "$link" burst "$burst" latency 200ms
  done
  # What the link carries: one TCP stream of 64 MiB from host 0 to host 1.
  measured=$(ip netns exec "$ns1" .venv/bin/python - "$ns0" <<'PYEOF'
import socket, subprocess, sys, time
srv = socket.create_server(("10.231.0.2", 0))
port = srv.getsockname()[1]
sender = subprocess.Popen(["ip", "netns", "exec", sys.argv[1], sys.executable, "-c",
    "import socket; s = socket.create_connection(('10.231.0.2', %d)); b = bytes(1 << 20); "
    "[s.sendall(b) for _ in range(64)]; s.close()" % port])
conn, _ = srv.accept()
n, t0 = 0, time.perf_counter()
while chunk := conn.recv(1 << 20):
    n += len(chunk)
dt = time.perf_counter() - t0
sender.wait(timeout=60)
print(f"{n * 8 / dt / 1e9:.2f}")
PYEOF
)
  echo "[bench] link $link (tbf, burst $burst B, MTU 9000): one TCP stream carried $measured Gbit/s"
  ws=()
  grep -q -- "--world-sizes" <<<"$*" || ws=(--world-sizes 4 6)
  .venv/bin/python bench/bench_collectives.py "$@" ${ws[@]+"${ws[@]}"} \
    --netns "$ns0,v0,10.231.0.1" "$ns1,v1,10.231.0.2" \
    --link "veth pair, tbf rate $link burst $burst B, MTU 9000; one TCP stream measured $measured Gbit/s" \
    $(grep -q -- "--json" <<<"$*" || echo "--json bench/results/link_$link.json") \
    $(grep -q -- "--plot\|--no-plot" <<<"$*" || echo "--plot bench/results/link_$link.png")
  exit $?
fi
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
run hierarchical_uneven bench/bench_collectives.py --world-sizes 4 --host-sizes 3 1 \
  --collectives all_reduce --json "$out/compare_hierarchical_uneven.json" \
  --plot "$out/compare_hierarchical_uneven.png" "$@"
run zero_copy bench/bench_collectives.py --world-sizes 2 4 --zero-copy \
  --collectives all_gather_into_tensor reduce_scatter_tensor all_reduce broadcast \
  --json "$out/compare_zero_copy.json" --plot "$out/compare_zero_copy.png" "$@"
run fused bench/bench_fused.py --small-n 64 128 256 512 --world-sizes 2 4 --dtypes float32 \
  --out-dir "$out"
# shellcheck disable=SC2012
fused=$(ls -t "$out"/fused-small-n-*.json 2>/dev/null | head -1)
[ -n "$fused" ] && cp "$fused" "$out/compare_fused.json"
# The guard: every ratio that got worse by more than 10% than the committed baselines.
echo
.venv/bin/python bench/compare_results.py --results "$out" || status=$?
exit $status
