"""The regression guard of `bash scripts/bench.sh --compare` (issue 59): reads the ratios of a run
(bench/results/compare_*.json) and of the committed baselines (bench/baselines/compare_*.json),
and lists every ratio that got worse by more than --tolerance (default 10%).

A ratio is measured within one run, against a baseline of the same run (bench/README.md), so two
runs compare by their ratios, not by their times. The ratios, per cell (world size, collective or
op, size):

  compare_deepspeed*, compare_hierarchical, compare_zero_copy (bench_collectives.py):
    speedup                    Gloo's time / cuda_p2p's (higher is better; runs over several
                               hosts only: flat Gloo against the hierarchy)
    vs_deepspeed.<form>        DeepSpeed's time / ours (higher is better; when it ran)
    zero_copy.<column>.ratio   the zero-copy column's time / the staged one's (lower is better)
  compare_fused (bench_fused.py --small-n):
    fused/unfused, auto/unfused, zero_copy/heap_staged   times (lower is better)

A cell that is in only one of the two files is not compared (other sizes or world sizes).
Exit code 0 when nothing got worse, 3 when something did (the list says what), 2 on bad input.
--save writes the results' ratios into --baseline (the committed baselines hold ratios only).

  .venv/bin/python bench/compare_results.py [--baseline bench/baselines] [--results bench/results]
                                            [--tolerance 0.10] [--save]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def collective_ratios(doc: dict) -> dict[tuple, tuple[float, bool]]:
    """{(world size, collective, bytes, ratio name): (value, higher is better)} of a
    bench_collectives.py JSON document. The speedup over Gloo counts on a run over several
    (simulated) hosts only, where flat Gloo is the baseline the hierarchy must beat; elsewhere
    Gloo's own time swings too much between runs on a small machine to guard a ratio over it
    (bench/README.md, "The regression guard")."""
    out = {}
    hosts = (doc.get("meta") or {}).get("hosts") or 1
    for run in doc.get("runs", []):
        W = run.get("world_size")
        for e in run.get("results", []):
            cell = (W, e.get("collective"), e.get("bytes"))
            if hosts > 1 and isinstance(e.get("speedup"), (int, float)):
                out[cell + ("speedup vs gloo",)] = (float(e["speedup"]), True)
            for form, v in (e.get("vs_deepspeed") or {}).items():
                if isinstance(v, (int, float)):
                    out[cell + (f"vs_deepspeed.{form}",)] = (float(v), True)
            for column, s in (e.get("zero_copy") or {}).items():
                if isinstance(s, dict) and isinstance(s.get("ratio_vs_staged"), (int, float)):
                    out[cell + (f"{column} / staged",)] = (float(s["ratio_vs_staged"]), False)
    return out


def fused_ratios(doc: dict) -> dict[tuple, tuple[float, bool]]:
    """The same for a bench_fused.py --small-n JSON document (times: lower ratios are better)."""
    out = {}
    for r in doc.get("results", []):
        cell = (r.get("W"), r.get("op"), f"{r.get('M')}x{r.get('K')}x{r.get('N')} {r.get('dtype')}")
        for name, num, den in (("fused / unfused", "fused", "unfused"),
                               ("auto / unfused", "auto", "unfused"),
                               ("zero_copy / heap_staged", "fused_zero_copy", "fused_heap_staged")):
            a, b = r.get(num), r.get(den)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
                out[cell + (name,)] = (a / b, False)
    return out


def ratios(path: Path) -> dict[tuple, tuple[float, bool]]:
    """The ratios of a result file, or of a baseline written by --save (its ratios only)."""
    doc = json.loads(path.read_text())
    if "ratios" in doc:
        return {tuple(r[:-2]): (float(r[-2]), bool(r[-1])) for r in doc["ratios"]}
    return fused_ratios(doc) if "results" in doc and "runs" not in doc else collective_ratios(doc)


def save(results_dir: Path, baseline_dir: Path) -> int:
    """Writes the ratios of every compare_*.json of `results_dir` into `baseline_dir` (the files
    the guard compares with: a few KiB each, not the runs' samples). Where the baseline has the
    ratio already, the worse of the two stays: saving several runs of the same code makes the
    baseline their envelope, so that the guard reports what no run of it reached, not the
    machine's noise between runs (bench/README.md)."""
    baseline_dir.mkdir(parents=True, exist_ok=True)
    n = 0
    for path in sorted(results_dir.glob("compare_*.json")):
        doc = json.loads(path.read_text())
        meta = doc.get("meta") or doc.get("machine") or {}
        merged = ratios(path)
        old = baseline_dir / path.name
        runs = 1
        if old.exists():
            prev = json.loads(old.read_text())
            runs = int(prev.get("runs", 1)) + 1
            for key, (v, higher) in ratios(old).items():
                if key in merged:
                    now = merged[key][0]
                    merged[key] = (min(v, now) if higher else max(v, now), higher)
        rows = [list(k) + [v, higher] for k, (v, higher) in sorted(merged.items(), key=str)]
        keep = {k: meta[k] for k in ("timestamp", "git", "host", "cpu_count", "torch") if k in meta}
        head = json.dumps({"source": path.name, "runs": runs, "meta": keep})[:-1]
        body = ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in rows)
        (baseline_dir / path.name).write_text(f'{head},\n "ratios": [\n  {body}\n ]\n}}\n')
        n += 1
    print(f"[compare] wrote the ratios of {n} files into {baseline_dir}")
    return 0 if n else 2


def worse(baseline: float, now: float, higher_is_better: bool, tolerance: float) -> bool:
    """Whether `now` is worse than `baseline` by more than `tolerance` (a fraction)."""
    if higher_is_better:
        return now < baseline * (1 - tolerance)
    return now > baseline * (1 + tolerance)


def compare(baseline_dir: Path, results_dir: Path, tolerance: float) -> tuple[list, int]:
    """The ratios that got worse ([(file, cell, baseline, now)]) and how many were compared."""
    found, compared = [], 0
    for base in sorted(baseline_dir.glob("compare_*.json")):
        new = results_dir / base.name
        if not new.exists():
            print(f"[compare] {base.name}: no result in {results_dir} (not run?)", file=sys.stderr)
            continue
        old_r, new_r = ratios(base), ratios(new)
        for key in sorted(set(old_r) & set(new_r), key=str):
            (b, higher), (n, _) = old_r[key], new_r[key]
            compared += 1
            if worse(b, n, higher, tolerance):
                found.append((base.name, key, b, n))
    return found, compared


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, default=HERE / "baselines")
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--tolerance", type=float, default=0.10,
                    help="how much worse a ratio may get before it is listed (default 0.10)")
    ap.add_argument("--save", action="store_true",
                    help="write the results' ratios into --baseline instead of comparing")
    args = ap.parse_args(argv)
    if args.save:
        return save(args.results, args.baseline)
    if not args.baseline.is_dir() or not any(args.baseline.glob("compare_*.json")):
        print(f"[compare] no baselines in {args.baseline}", file=sys.stderr)
        return 2
    found, compared = compare(args.baseline, args.results, args.tolerance)
    if not found:
        print(f"[compare] {compared} ratios compared with {args.baseline}: none got worse by "
              f"more than {args.tolerance:.0%}")
        return 0
    print(f"[compare] {len(found)} of {compared} ratios got worse by more than "
          f"{args.tolerance:.0%} than {args.baseline}:")
    print("| file | cell | ratio | baseline | now | change |")
    print("|---|---|---|---:|---:|---:|")
    for name, key, b, n in found:
        print(f"| {name} | {' '.join(str(k) for k in key[:-1])} | {key[-1]} | {b:.3f} | {n:.3f} "
              f"| {(n / b - 1) * 100:+.0f}% |")
    return 3


if __name__ == "__main__":
    sys.exit(main())
