"""The CPU seconds per test file of one scripts/test.sh run, as a Markdown table.

    python scripts/cpu_table.py build/stages/pytest-cpu-*.json

Each JSON file is one pytest run's report (tests/python/_cpu_report.py: {file: [cpu_s, wall_s]});
a file that ran in several pytest runs (the CUDA-semantics rerun) gets their sum. docs/testing.md's
table comes from this.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", help="JSON reports of tests/python/_cpu_report.py")
    args = ap.parse_args()
    rows: dict[str, list[float]] = {}
    for path in args.reports:
        with open(path) as f:
            for name, (cpu, wall) in json.load(f).items():
                acc = rows.setdefault(name, [0.0, 0.0])
                acc[0] += cpu
                acc[1] += wall
    print("| test file | CPU s | wall s |")
    print("|---|---:|---:|")
    for name, (cpu, wall) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        print(f"| {name} | {cpu:.0f} | {wall:.0f} |")
    print(f"| **total** | **{sum(r[0] for r in rows.values()):.0f}** | "
          f"**{sum(r[1] for r in rows.values()):.0f}** |")


if __name__ == "__main__":
    main()
