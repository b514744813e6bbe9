"""What the rank-side checks of the workspace collectives' test files share: a case counter that
collects failures instead of stopping at the first, the parent-side verdict on its results, and
whether an error names a rank."""

from __future__ import annotations

import re


class Checker:
    def __init__(self, label):
        self.label, self.cases, self.failures = label, 0, []

    def case(self, what, ok, detail=""):
        self.cases += 1
        if not ok:
            self.failures.append(f"{self.label} {what}: {detail}")

    def result(self):
        return {"cases": self.cases, "failures": self.failures}


def wrapped(counters):
    """The `<op>.wrapped` entries of a backend's counters."""
    return {k: v for k, v in counters.items() if k.endswith(".wrapped")}


def expect_nothing_wrapped(chk, backend):
    """A case: no op of `backend` went to the wrapped backend since its counters were reset."""
    c = backend.get_counters()
    chk.case("nothing wrapped", not wrapped(c), f"{c}")


def raises(call):
    """The message of the RuntimeError/ValueError `call()` raises, or None when it returns."""
    try:
        call()
    except (RuntimeError, ValueError) as e:
        return str(e)
    return None


def gloo_ok(fn):
    """Runs a Gloo reference call: True, or None where Gloo lacks the dtype (int16, bool)."""
    try:
        fn()
        return True
    except RuntimeError as e:
        if "Invalid scalar type" in str(e) or "not supported" in str(e).lower():
            return None
        raise


def assert_ok(results, min_cases=1):
    """Every rank's check passed and ran at least `min_cases` cases."""
    for r, res in enumerate(results):
        assert not res["failures"], f"rank {r}:\n" + "\n".join(res["failures"][:20])
        assert res["cases"] >= min_cases, (r, res["cases"])


def names_rank(text: str | None, rank: int) -> bool:
    """Whether an error names `rank` among the ranks it lists ("rank 2 never arrived", "ranks 1,
    2 never arrived"): on a loaded machine a rank that did come may be late too, and named beside
    the one that never came."""
    return text is not None and bool(re.search(rf"\brank {rank}\b|\branks? [0-9, ]*\b{rank}\b",
                                               text))
