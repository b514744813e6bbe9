"""The documentation's relative links resolve: every `[text](path#anchor)` of a tracked Markdown
file names a file of the tree and, with an anchor, a heading of that file (GitHub's anchors);
docs/measurements/README.md indexes every file of its folder. No build needed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _markdown_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [ROOT / f for f in out if (ROOT / f).is_file()]


def _prose_lines(path: Path):
    """(line number, text) of the lines outside fenced code, inline code removed."""
    fenced = False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield i, re.sub(r"`[^`]*`", "``", line)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = _slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def _broken_links() -> list[str]:
    broken = []
    anchors: dict[Path, set[str]] = {}
    for md in _markdown_files():
        for lineno, line in _prose_lines(md):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                dest = (md.parent / path).resolve() if path else md
                where = f"{md.relative_to(ROOT)}:{lineno}: ({target})"
                if not dest.exists():
                    broken.append(f"{where}: no such file")
                    continue
                if anchor and dest.suffix == ".md":
                    if dest not in anchors:
                        anchors[dest] = _anchors(dest)
                    if anchor not in anchors[dest]:
                        broken.append(f"{where}: no heading with that anchor")
    return broken


def test_relative_links_resolve():
    broken = _broken_links()
    assert not broken, f"{len(broken)} broken link(s):\n" + "\n".join(broken)


def test_the_checker_finds_a_broken_link(tmp_path, monkeypatch):
    """The check can fail: a missing file and a missing anchor are both reported."""
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n\n[ok](#title) [gone](b.md) [bad anchor](#nope)\n"
                   "```\n[in code](c.md)\n```\n", encoding="utf-8")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "_markdown_files", lambda: [doc])
    broken = _broken_links()
    assert len(broken) == 2 and "no such file" in broken[0] and "anchor" in broken[1], broken


def test_measurements_index_lists_every_file():
    folder = ROOT / "docs" / "measurements"
    index = (folder / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\]\(([^)#]+\.md)\)", index))
    files = {p.name for p in folder.glob("*.md") if p.name != "README.md"}
    assert files <= listed, f"not in docs/measurements/README.md: {sorted(files - listed)}"
