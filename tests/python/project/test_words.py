"""Retired words stay retired: names that a vocabulary sweep replaced do not come back in the
tracked files (docs/measurements/ is a log of what was, and keeps them). No build needed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Each retired word (a case-insensitive pattern) and the word that replaced it.
RETIRED = {
    r"private[-_ ]read": "cross-memory read (NOTE [Cross-memory probe])",
    r"copy[-_ ]free": "cross-memory read, or zero-copy",
    r"CompletedWork": "EventWork (complete at once on a synchronous host device)",
    r"flat_chunk": "detail::element_chunk (backend/tensor_args.hpp)",
    r"PrivateMemoryReader|read_peer_private": "the cross-memory reader (HostPaths)",
    r"\bOpKind\b|Counters::Op\b": "ops::OpId, one row per op in ops/op_spec.hpp",
}
# Where they may stay: measurement logs (history), and this file.
EXEMPT = ("docs/measurements/", "tests/python/project/test_words.py")


def _tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [f for f in out if not f.startswith(EXEMPT) and not f.startswith("third_party/")
            and (ROOT / f).is_file()]


def test_no_retired_word_comes_back():
    found = []
    patterns = {word: re.compile(word, re.IGNORECASE) for word in RETIRED}
    for name in _tracked_text_files():
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):  # a binary file
            continue
        for i, line in enumerate(text.splitlines(), 1):
            for word, pattern in patterns.items():
                if pattern.search(line):
                    found.append(f"{name}:{i}: retired '{word}' (now: {RETIRED[word]}): "
                                 f"{line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_the_check_finds_a_retired_word(tmp_path):
    """The patterns match what they retire (a check that cannot fail is no check)."""
    samples = ["NOTE [Private-read probe]", "a copy-free read", "class CompletedWork",
               "flat_chunk(t, 0, 4)", "read_peer_private(p)", "ops::OpKind::kGather"]
    for sample, word in zip(samples, RETIRED):
        assert re.search(word, sample, re.IGNORECASE), (sample, word)
