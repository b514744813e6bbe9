"""How fast this machine's CPUs run now: the CPU seconds a fixed piece of Python work takes,
sampled every few seconds for the whole test run (scripts/test.sh starts it beside the stages;
scripts/stages.sh scales the CPU budgets by the samples' median, docs/testing.md "Budgets").

Machines of the project's kind differ by up to ~1.8x in speed, and one machine drifts within a
day: the same stage's CPU seconds move with it, so a fixed CPU budget would flag a slow machine
as grown work. Measured as CPU time of this process, not wall time: a busy machine that merely
shares its cores does not count as a slow one.

    python3 scripts/cpu_speed.py                  one sample, printed
    python3 scripts/cpu_speed.py --every 15 --out F   a sample every 15 s, appended to F
"""

from __future__ import annotations

import argparse
import time

# Loop iterations of one sample: about 0.14 s of CPU on the fastest machine of the kind seen.
WORK = 1_000_000


def sample() -> float:
    t0 = time.process_time()
    x = 0
    for i in range(WORK):
        x += i * i
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=0, help="seconds between samples (0: one)")
    ap.add_argument("--out", help="file the samples are appended to, one per line")
    args = ap.parse_args()
    while True:
        s = sample()
        if args.out:
            with open(args.out, "a") as f:
                f.write(f"{s:.4f}\n")
        else:
            print(f"{s:.4f}")
        if args.every <= 0:
            return
        time.sleep(args.every)


if __name__ == "__main__":
    main()
