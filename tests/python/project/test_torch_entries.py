"""The C++ sources build against the oldest torch we support, whose c10d lacks entries CI's has.

CI builds against torch 2.14; the GPU machines have torch 2.11, whose c10d::Backend lacks some
entries. CMakeLists.txt detects each entry from the headers (CUDA_P2P_C10D_HAS_<NAME>), and every
use of one torch 2.11 lacks must sit inside `#if...CUDA_P2P_C10D_HAS_<NAME>` (not in its #else).
CI never compiles against torch 2.11, so this reads the sources instead: on 2026-12-04 a test that
called `registerAbortHook` and `getBackendOptions()->clone()` unguarded cost a GPU lease its
first machine (the build failed there).
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[3]
FOLDERS = ["p2p_workspace", "ops", "backend", "python", "tests/cpp"]
SUFFIXES = {".cpp", ".hpp", ".cu", ".cuh", ".inc"}

# The entries torch 2.11's c10d lacks (the GPU machine's configure on 2026-12-04 found SHRINK,
# SPLIT, MERGE, ERROR_TYPE and GROUP_UID only), with what a use of each looks like. The
# workspace's own all_to_all_single (collectives_.all_to_all_single) is not c10d's.
LACKING_IN_2_11 = {
    "SINGLE_ENTRIES": r"\b(all_gather_single|reduce_scatter_single)(_coalesced)?\s*\("
    r"|(->|ProcessGroupCudaP2P::)all_to_all_single(_coalesced)?\s*\(",
    "GATHER_SINGLE": r"\bgather_single\s*\(",
    "GATHER_INTO_TENSOR": r"\bgather_into_tensor\s*\(",
    "ABORT_HOOKS": r"\b(un)?registerAbortHook\s*\(",
    "OPTIONS_CLONE": r"getBackendOptions\(\)\s*->\s*clone\s*\(",
}


def unguarded_uses(text: str):
    """(line, entry, code) of every use not inside `#if...CUDA_P2P_C10D_HAS_<entry>`."""
    stack = []  # [directive, in its #else]
    found = []
    for n, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if s.startswith("#if"):
            stack.append([s, False])
        elif s.startswith(("#else", "#elif")) and stack:
            stack[-1][1] = True
        elif s.startswith("#endif") and stack:
            stack.pop()
        code = line.split("//", 1)[0]
        for name, pattern in LACKING_IN_2_11.items():
            if re.search(pattern, code) and not any(
                f"CUDA_P2P_C10D_HAS_{name}" in d and not in_else for d, in_else in stack
            ):
                found.append((n, name, s))
    return found


def test_the_entries_named_here_are_the_ones_cmake_detects():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    detected = set(re.findall(r'"([A-Z_]+)\|[^"]+"', cmake))
    assert set(LACKING_IN_2_11) <= detected, set(LACKING_IN_2_11) - detected


def test_every_use_of_an_entry_torch_2_11_lacks_is_guarded():
    bad = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in SUFFIXES:
                continue
            for n, name, code in unguarded_uses(path.read_text(errors="ignore")):
                bad.append(f"{path.relative_to(ROOT)}:{n}: uses {name} outside "
                           f"#ifdef CUDA_P2P_C10D_HAS_{name}: {code}")
    assert not bad, "\n".join(bad)


def test_the_check_sees_what_broke_the_gpu_build():
    # test_child_groups.cpp before 2026-12-04: both calls unguarded; the same under the guard.
    broke = "auto opts = parent->getBackendOptions()->clone();\nparent->registerAbortHook(1, f);\n"
    assert [name for _, name, _ in unguarded_uses(broke)] == ["OPTIONS_CLONE", "ABORT_HOOKS"]
    guarded = ("#ifdef CUDA_P2P_C10D_HAS_ABORT_HOOKS\nparent->registerAbortHook(1, f);\n"
               "#else\nparent->registerAbortHook(2, f);\n#endif\n")
    assert [n for n, _, _ in unguarded_uses(guarded)] == [4]  # the #else branch's use
