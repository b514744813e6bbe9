"""docs/configuration.md lists exactly the knobs backend/config.cpp reads (one place for
configuration), and the Python Options expose every Options knob."""

from __future__ import annotations

import re
from pathlib import Path

import cuda_p2p
from cuda_p2p import _C

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _doc_rows():
    text = DOC.read_text()
    table = text.split("<!-- knobs: begin -->")[1].split("<!-- knobs: end -->")[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        option, env, typ, default, help_ = cells
        rows.append({"option": option.strip("`") if option != "-" else "",
                     "env": env.strip("`") if env != "-" else "",
                     "type": typ, "default": default, "help": help_})
    return rows


def test_docs_table_matches_the_knobs():
    assert _doc_rows() == list(_C._config_knobs()), (
        "docs/configuration.md is out of date with backend/config.cpp: regenerate the table "
        "from cuda_p2p._C._config_knobs()")


def test_every_options_knob_is_a_python_property():
    options = cuda_p2p.ProcessGroupCudaP2P.Options()
    for knob in _C._config_knobs():
        if knob["option"]:
            assert hasattr(options, knob["option"]), knob["option"]
