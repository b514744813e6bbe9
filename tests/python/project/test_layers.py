"""The house rules of the C++ sources (docs/design.md §3), checked on the source tree.

Layers point one way: python -> backend -> ops -> p2p_workspace. A file may include headers of its
own layer and of the layers below, never of one above (the CMake layer check refuses the matching
calls at link time). Configuration is read in one place: backend/config.cpp is the only file that
calls getenv.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[3]
# From the bottom up; a layer may include its own and the lower ones.
LAYERS = ["p2p_workspace", "ops", "backend", "python"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SUFFIXES = {".cpp", ".hpp", ".cu", ".cuh", ".inc"}


def _sources(layer):
    return sorted(p for p in (ROOT / layer).rglob("*") if p.suffix in SUFFIXES)


def _layer_of(include):
    top = include.split("/", 1)[0]
    return top if top in LAYERS else None


def test_every_layer_has_sources():
    for layer in LAYERS:
        assert _sources(layer), f"no C++ sources under {layer}/"


def test_includes_point_down_the_layers():
    back_edges = []
    for layer in LAYERS:
        allowed = set(LAYERS[: LAYERS.index(layer) + 1])
        for path in _sources(layer):
            for include in INCLUDE.findall(path.read_text()):
                target = _layer_of(include)
                if target is not None and target not in allowed:
                    back_edges.append(f"{path.relative_to(ROOT)} includes {include}")
    assert not back_edges, "includes that reach up a layer:\n" + "\n".join(back_edges)


def test_the_check_sees_a_back_edge(tmp_path):
    # The rule above must be able to fail: an ops file that includes a backend header.
    text = '#include "backend/ProcessGroupCudaP2P.hpp"\n#include "ops/common.hpp"\n'
    assert [_layer_of(i) for i in INCLUDE.findall(text)] == ["backend", "ops"]


def test_getenv_only_in_the_configuration_file():
    readers = []
    for layer in ("p2p_workspace", "ops", "backend"):
        for path in _sources(layer):
            if re.search(r"\b(std::)?(secure_)?getenv\s*\(", path.read_text()):
                readers.append(str(path.relative_to(ROOT)))
    assert readers == ["backend/config.cpp"], readers


def test_algorithms_see_only_the_device_interface():
    # Every algorithm is written once against p2p_workspace/device.hpp (docs/design.md §2): ops/
    # (but for its CUDA kernels, ops/cuda/) and the workspace's own files, headers and sources,
    # include no header of a device implementation (p2p_workspace/host/, p2p_workspace/cuda/):
    # the workspace reaches a device only through Device and its capabilities (HostPaths).
    # Creating a device is the backend's business.
    device_specific = re.compile(r"^p2p_workspace/(host|cuda)/")
    paths = [p for p in _sources("ops") if "cuda" not in p.relative_to(ROOT / "ops").parts[:-1]]
    paths += sorted((ROOT / "p2p_workspace").glob("*.hpp"))
    paths += sorted((ROOT / "p2p_workspace").glob("*.cpp"))
    offenders = [f"{p.relative_to(ROOT)} includes {i}" for p in paths
                 for i in INCLUDE.findall(p.read_text()) if device_specific.match(i)]
    assert not offenders, "device-specific includes:\n" + "\n".join(offenders)
    assert len(paths) > 10 and (ROOT / "p2p_workspace/device.hpp") in paths
    assert (ROOT / "p2p_workspace/symmetric_workspace.cpp") in paths


def test_device_classes_are_private_to_their_folders():
    # Issue 57: each device implementation declares its class in a private header
    # (host/host_device_impl.hpp, cuda/cuda_device_impl.hpp) that only the files of its own
    # folder include; everyone else makes a device through host_device.hpp / cuda_device.hpp and
    # reaches it through Device. Every Device member is pure, so a device answers each one itself.
    private = {"p2p_workspace/host/host_device_impl.hpp": "p2p_workspace/host",
               "p2p_workspace/cuda/cuda_device_impl.hpp": "p2p_workspace/cuda"}
    offenders = []
    for layer in LAYERS + ["tests"]:
        for path in _sources(layer):
            rel = path.relative_to(ROOT)
            for include in INCLUDE.findall(path.read_text()):
                folder = private.get(include)
                if folder is not None and str(rel.parent) != folder:
                    offenders.append(f"{rel} includes {include}")
    assert not offenders, "private device headers included elsewhere:\n" + "\n".join(offenders)
    for header in private:
        assert (ROOT / header).exists(), header
    device = (ROOT / "p2p_workspace/device.hpp").read_text()
    body = device[device.index("class Device {"):]
    body = body[:body.index("\n};")]
    defaulted = re.findall(r"virtual [^;]*\)[^;=]*\{", body)
    assert not defaulted, f"Device members with a default body: {defaulted}"


def test_no_product_file_over_800_lines():
    # Issue 57: a file a reader can hold; a subject that outgrows it splits by subject, as the
    # device classes did (host_device*.cpp, cuda_device*.cpp) and the mailbox records.
    long = [f"{p.relative_to(ROOT)}: {n} lines" for layer in LAYERS for p in _sources(layer)
            if (n := len(p.read_text().splitlines())) > 800]
    assert not long, "product files over 800 lines:\n" + "\n".join(long)


NOTE = re.compile(r"^\s*// NOTE \[([^\]]+)\]\s*$")
# What starts a new part of a NOTE: a blank comment line, a list item ("- ", "* ", "1. ", "1'. ",
# "stage     - "), or a heading ("Why: ...", "Invariants:").
NOTE_BREAK = re.compile(r"^$|^(\*|-|\d+'?\.)\s|^\w+( \d)?\s+- |^[A-Z][\w' ,()/-]{0,40}:(\s|$)|:$")


def _note_paragraphs():
    """(longest run of lines without a break, path, name) for every NOTE of the product."""
    for layer in LAYERS:
        for path in _sources(layer):
            lines = path.read_text().splitlines()
            i = 0
            while i < len(lines):
                m = NOTE.match(lines[i])
                if not m:
                    i += 1
                    continue
                run = longest = 0
                i += 1
                while i < len(lines) and lines[i].strip().startswith("//") \
                        and not NOTE.match(lines[i]):
                    text = lines[i].strip()[2:].strip()
                    run = (0 if not text else 1) if NOTE_BREAK.search(text) else run + 1
                    longest = max(longest, run)
                    i += 1
                yield longest, str(path.relative_to(ROOT)), m.group(1)


def test_notes_are_kept_in_short_parts():
    # Issue 57: a NOTE states its invariants in short parts - headed paragraphs and list items -
    # none over 12 lines; a longer one is a wall a reader skips.
    notes = list(_note_paragraphs())
    assert len(notes) > 100
    long = [f"{path}: NOTE [{name}] has a part of {n} lines" for n, path, name in notes if n > 12]
    assert not long, "NOTEs with a part over 12 lines:\n" + "\n".join(long)
    assert NOTE_BREAK.search("Why: because") and NOTE_BREAK.search("- a list item")
    assert not NOTE_BREAK.search("a line of a paragraph that goes on")


def test_the_mailboxes_have_their_own_folder():
    # NOTE [Where the mailboxes live] in p2p_workspace/messages/mailboxes.hpp: a message engine in
    # the bottom layer, reached from the backend only. From a device implementation it includes
    # the host's wait primitives alone; nothing below the backend (ops/, the workspace's own
    # files, the devices) includes it; and the host device's folder holds the device only.
    messages = ROOT / "p2p_workspace/messages"
    assert (messages / "mailboxes.hpp").exists() and (messages / "mailboxes.cpp").exists()
    assert not list((ROOT / "p2p_workspace/host").glob("mailboxes.*"))
    allowed = {"p2p_workspace/host/futex_wait.hpp"}
    device_specific = re.compile(r"^p2p_workspace/(host|cuda)/")
    offenders = [f"{p.relative_to(ROOT)} includes {i}" for p in _sources("p2p_workspace/messages")
                 for i in INCLUDE.findall(p.read_text())
                 if device_specific.match(i) and i not in allowed]

    def includes_them(path):
        return any(i.startswith("p2p_workspace/messages/")
                   for i in INCLUDE.findall(path.read_text()))

    users = [p for layer in ("p2p_workspace", "ops") for p in _sources(layer)
             if messages not in p.parents and includes_them(p)]
    offenders += [f"{p.relative_to(ROOT)} includes the mailboxes" for p in users]
    assert not offenders, "the mailboxes' rule is broken:\n" + "\n".join(offenders)
    backend_users = [p for p in _sources("backend")
                     if "p2p_workspace/messages/mailboxes.hpp" in INCLUDE.findall(p.read_text())]
    assert backend_users, "no backend file includes the mailboxes: is the rule still needed?"


# NOTE [One kernel source] (ops/kernel_body.hpp, issue 55): a CUDA kernel's logic is a
# template the host instantiates too, so that CI runs it. Every __global__ kernel of the CUDA
# sources is listed here with the shared body it instantiates (the header, the entry its body
# calls, and the CUDA device function it calls that through, if any). A new kernel, or one that
# stops calling its shared body, fails this test until it calls one that a host source or a C++
# test instantiates.
KERNELS = {
    # The data steps shared; its flag barriers (graph_barrier) are CUDA's own still, the host's
    # are GraphRun's in p2p_workspace/host/host_device_capture.cpp.
    "graph_collective_kernel": ("ops/graph_collective_body.hpp", "collective_step"),
    # One data step of it alone, for the kernel matrix on a GPU (test_cuda_kernel_matrix.cpp).
    "graph_collective_step_kernel": ("ops/graph_collective_body.hpp", "collective_step"),
    # The flag barrier alone; its stores, polls and decisions are GraphRun's (the host's), through
    # the device function graph_barrier (p2p_workspace/cuda/graph_barrier.cuh).
    "graph_barriers_kernel": ("p2p_workspace/flag_barrier_body.hpp", "flag_poll", "graph_barrier"),
    # The eager one-pass reduction: the host's own ops run its AVX2 kernel (ops/reduction.cpp),
    # test_kernel_matrix this body.
    "reduce_kernel": ("ops/kernel_body.hpp", "reduce_kernel_body"),
    # The signal waits' polls and decisions, through the device function poll_until_decided: the
    # counted wait's are the host device's with CUDA's semantics (p2p_workspace/host/
    # host_device_cuda_semantics.cpp); the eager wait is the fallback of a stream memory
    # operation, which the host's eager waits stand for, and test_kernel_matrix runs its
    # decisions on plain memory.
    "wait_signals_kernel": ("p2p_workspace/signal_wait_body.hpp", "signal_wait_poll",
                            "poll_until_decided"),
    "wait_counted_kernel": ("p2p_workspace/signal_wait_body.hpp", "signal_wait_poll",
                            "poll_until_decided"),
    # One store each: the host device's write_signal, advance_counter and write_counted tasks.
    "write_signal_kernel": ("p2p_workspace/signal_store_body.hpp", "signal_write"),
    "advance_counter_kernel": ("p2p_workspace/signal_store_body.hpp", "counter_advance"),
    "write_counted_kernel": ("p2p_workspace/signal_store_body.hpp", "counted_write"),
    # The op signatures' words: the host's handshake in ops/op_signature.cpp runs the same body.
    "publish_signature_kernel": ("ops/signature_body.hpp", "signature_publish_word"),
    "compare_signatures_kernel": ("ops/signature_body.hpp", "signature_word_differs"),
    # ~2 us of the GPU's timer before a fused pipeline's second stream (delay_stream in
    # ops/pipeline_common.cpp); the host's streams need no such delay: test_kernel_matrix runs
    # the body on a made-up clock.
    "sleep_kernel": ("ops/sleep_body.hpp", "sleep_for"),
}
GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(")


DEVICE_FN = re.compile(r"__device__\s+(?:__forceinline__\s+)?\w+\s+(\w+)\s*\(")


def _kernel_bodies(pattern=GLOBAL):
    """{name: its body's text} of every __global__ function of the CUDA sources (or of every
    function `pattern` finds)."""
    bodies = {}
    for path in sorted(ROOT.rglob("*.cu")) + sorted(ROOT.rglob("*.cuh")):
        if any(part in (".venv", "third_party", "build") for part in path.parts):
            continue
        text = path.read_text()
        for m in pattern.finditer(text):
            start = text.index("{", m.end())
            depth, i = 0, start
            while True:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            bodies[m.group(1)] = text[start:i + 1]
    return bodies


def test_every_kernel_says_what_of_it_ci_runs():
    bodies = _kernel_bodies()
    assert set(bodies) == set(KERNELS), (
        f"kernels not listed in KERNELS: {sorted(set(bodies) - set(KERNELS))}; listed but gone: "
        f"{sorted(set(KERNELS) - set(bodies))}")
    # The host instantiates every body: a C++ (not CUDA) source of a layer or a C++ test includes
    # its header (CI runs the tests' instantiations: test_kernel_matrix's).
    host_sources = [p for layer in LAYERS for p in _sources(layer) if p.suffix in {".cpp", ".hpp"}]
    host_sources += sorted((ROOT / "tests" / "cpp").rglob("*.cpp"))
    for name, shared in KERNELS.items():
        assert shared is not None, f"{name}: a kernel whose body CI does not run"
        header, entry, *via = shared
        body = bodies[name]
        if via:
            assert re.search(rf"\b{via[0]}\s*\(", body), f"{name} does not call {via[0]}"
            body = _kernel_bodies(DEVICE_FN)[via[0]]
        assert re.search(rf"\b{entry}\s*[<(]", body), f"{name} does not call {entry}"
        assert f"{entry}(" in (ROOT / header).read_text(), f"{header} defines no {entry}"
        assert any(f'#include "{header}"' in p.read_text() for p in host_sources
                   if "/cuda/" not in str(p)), f"no host source includes {header}"
