"""Every figure in the tables of README.md and docs/HISTORY.md is read from a committed result file.

The markdown tables of both files are parsed (README.md is the user's guide with a short results
section; docs/HISTORY.md keeps the measurement record); every number in a cell other than the first (the row's label:
a benchmark, a space, an op, with its shapes) must appear in some JSON file under
``benchmarks/results/`` at the precision it is shown with: a figure shown with ``d`` decimals matches a
value within half a unit of its last digit (so 88.3 matches 88.25 and 0.142 matches 0.1418); a
percentage also matches a fraction (0.17% matches 0.0017). Shapes (``4096^3``, ``16x1024^3``,
``1024x4096x4096``) are labels, not figures. A figure that is derived from a result file rather than
stored in one must be listed in :data:`DERIVED` with the computation that gives it.

Each table is checked against the files its caption names (:data:`TABLE_SOURCES`). Only table cells
are checked: prose around the tables may change freely. A hand-edited table figure that no result
file of its table holds fails this test; one edited into another value the same files happen to hold
(likelier for small integers and two-digit figures) passes: the check is a set lookup, not a
cell-by-cell recomputation.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
HISTORY = ROOT / "docs" / "HISTORY.md"
#: the files whose markdown tables this test checks
DOCS = (README, HISTORY)
RESULTS = ROOT / "benchmarks" / "results"


def docs_text() -> str:
    """README.md and docs/HISTORY.md, one after the other (tables never span the join)."""
    return "\n\n".join(p.read_text() for p in DOCS)


def _read(path: Path):
    """A result file's JSON (``.json``, or ``.json.gz`` as the larger ones are committed)."""
    if path.name.endswith(".gz"):
        import gzip

        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def _load(rel: str):
    return _read(RESULTS / rel)


def _strategy(space: str, strategy: str) -> dict:
    return next(r for r in _load("h200/strategies_no_baseline.json")
                if r["space"].startswith(space) and r["strategy"] == strategy)


#: The result files each table is read from, by the table's first header cell (the files its
#: caption names). A table not listed here is checked against every result file.
TABLE_SOURCES: dict[str, list[str]] = {
    "measured on one H200": ["h200/decoder_layer.json", "h200/kernels_compute_wt.json", "h200/kernels_memory.json",
                             "h200/tuning_speed.json", "h200/fault_matrix.json", "h200/dispatch_overhead.json",
                             "h200/first_call_linear.json", "h200/graphs_compile.json", "h200/first_forward.json",
                             "h200/nearest_quality.json", "h200/compile_tax.json", "h200/fault_space.json",
                             "h200/tuning_speed_cold.json", "h200/nearest_quality_race_seed5.json.gz",
                             "h200/tuning_speed_cold_matmul_rmsnorm_2026-12-06.json.gz",
                             "h200/first_forward_seed53_2026-12-07.json.gz", "h200/hf_patch_decode_2026-12-07.json.gz",
                             "h200/fault_space_2026-12-07_0603.json.gz", "h200/fault_space_2026-12-07_0604.json.gz",
                             "h200/tuning_speed_cold_2026-12-07.json.gz", "h200/first_forward_seed67_2026-12-07.json.gz",
                             "h200/fault_space_2026-12-07_run13.json.gz", "h200/fault_space_2026-12-07_run19.json.gz",
                             "h200/offgrid_attention_seed61_2026-12-07.json.gz", "h200/offgrid_gemm_seed61_2026-12-07.json.gz",
                             "h200/tuning_speed_cold_2026-12-07_bd.json.gz",
                             "h200/nearest_quality_gemm_seed13_2026-12-07.json.gz"],
    "benchmark": ["h200/tuning_speed.json", "h200/warm_start.json", "h200/dispatch_overhead.json",
                  "h200/determinism.json", "h200/fault_matrix.json", "h200/host_cost.json.gz",
                  "h200/graphs_compile.json", "h200/first_call.json", "h200/ab.json",
                  "h200/campaign.json"],
    "space (valid configs)": ["h200/strategies_no_baseline.json"],
    "memory-bound op vs the fastest torch route": ["h200/kernels_memory.json"],
    "memory-bound op, earlier sweep": ["h200/sweep-2026-12-01/kernels_memory.json.gz"],
    "compute-bound vs the fastest torch route": ["h200/kernels_compute.json"],
    "GEMM with nn.Linear's weight layout": ["h200/kernels_compute_wt.json"],
    "compute-bound, earlier sweep": ["h200/sweep-2026-12-01/kernels_compute.json.gz"],
    "decoder layer": ["h200/decoder_layer.json", "h200/decoder_layer_qwen2.5-7b.json",
                      "h200/decoder_layer_fused_mlp.json.gz"],
    # HISTORY.md's H100 rows: every H100 result file, plain or gzipped
    "measured on one H100": sorted(str(p.relative_to(RESULTS)) for p in (RESULTS / "h100").rglob("*.json*")
                                   if p.name.endswith((".json", ".json.gz"))),
}

#: Figures computed from a result file (not stored in one): (table row label prefix, figure as shown)
#: -> a function returning the unrounded value. Keep this short, each with its reason.
#: Empty today: every table figure is stored as shown (rounded) in its files.
DERIVED: dict[tuple[str, str], object] = {}


def _numbers(obj) -> list[float]:
    out: list[float] = []
    if isinstance(obj, bool):
        return out
    if isinstance(obj, (int, float)):
        if math.isfinite(obj):
            out.append(float(obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k != "profile":  # cProfile rows are diagnostics, never table figures (and thousands of numbers)
                out += _numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _numbers(v)
    return out


def stored_numbers(files: list[Path]) -> list[float]:
    values: set[float] = set()
    for f in files:
        values.update(_numbers(_read(f)))
    return sorted(values)


def sources(first_header: str) -> list[Path]:
    for prefix, files in TABLE_SOURCES.items():
        if first_header.startswith(prefix):
            return [RESULTS / f for f in files]
    return sorted(p for p in RESULTS.rglob("*.json*") if p.name.endswith((".json", ".json.gz")))




def readme_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Markdown tables of ``text``: (header cells, body rows of cells)."""
    tables = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if (lines[i].lstrip().startswith("|") and i + 1 < len(lines)
                and re.match(r"^\s*\|?\s*:?-{3,}", lines[i + 1])):
            header = _cells(lines[i])
            body = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                body.append(_cells(lines[i]))
                i += 1
            tables.append((header, body))
        else:
            i += 1
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


_SHAPE = re.compile(r"\d+(?:x\d+)+(?:\^\d+)?|\d+\^\d+")
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(%?)")


def figures(cell: str) -> list[tuple[str, bool]]:
    """Numbers shown in a cell, as written, and whether each is a percentage (shapes left out)."""
    cell = _SHAPE.sub(" ", cell.replace("**", "").replace("`", ""))
    return [(m.group(1), m.group(2) == "%") for m in _NUMBER.finditer(cell)]


def _held(stored: list[float], shown: str, percent: bool) -> bool:
    value = float(shown)
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    half = 0.5 * 10.0 ** -decimals * (1 + 1e-9) + 1e-12
    targets = [value] + ([value / 100.0] if percent else [])
    halves = [half] + ([half / 100.0] if percent else [])
    for t, h in zip(targets, halves):
        i = bisect.bisect_left(stored, t - h)
        if i < len(stored) and stored[i] <= t + h:
            return True
    return False


def table_figures(text: str | None = None) -> list[tuple[str, str, str, bool, str]]:
    """(row label, column header, figure, is a percentage, table's first header cell) of every figure
    in the tables of README.md and docs/HISTORY.md (or in ``text``'s)."""
    out = []
    for header, body in readme_tables(docs_text() if text is None else text):
        for row in body:
            for col, cell in enumerate(row[1:], start=1):
                name = header[col] if col < len(header) else f"column {col}"
                for shown, percent in figures(cell):
                    out.append((row[0], name, shown, percent, header[0]))
    return out


def test_table_sources_exist():
    for files in TABLE_SOURCES.values():
        for f in files:
            assert (RESULTS / f).is_file(), f
    heads = [h[0] for h, _ in readme_tables(docs_text())]
    for prefix in TABLE_SOURCES:  # every listed table is still in README.md or docs/HISTORY.md
        assert any(h.startswith(prefix) for h in heads), prefix


def test_readme_has_the_tables_this_test_checks():
    tables = readme_tables(docs_text())
    assert len(tables) >= 4
    assert len(table_figures()) >= 80


def unsourced_figures(text: str | None = None) -> list[str]:
    """Table figures (README.md, docs/HISTORY.md) that no result file of their table holds."""
    missing = []
    cache: dict[str, list[float]] = {}
    for label, column, shown, percent, head in table_figures(text):
        if head not in cache:
            cache[head] = stored_numbers(sources(head))
        derived = next((fn for (prefix, fig), fn in DERIVED.items() if label.startswith(prefix) and fig == shown),
                       None)
        if derived is not None:
            decimals = len(shown.split(".")[1]) if "." in shown else 0
            if abs(derived() - float(shown)) <= 0.5 * 10.0 ** -decimals * (1 + 1e-9):
                continue
        if not _held(cache[head], shown, percent):
            missing.append(f"{label[:50]!r} / {column!r}: {shown}{'%' if percent else ''}")
    return missing


def test_every_readme_table_figure_is_in_a_result_file():
    missing = unsourced_figures()
    assert not missing, "table figures found in no result file:\n" + "\n".join(missing)


@pytest.mark.parametrize("old, new", [
    ("ratio **0.142**", "ratio **0.140**"),
    ("gap **0.19%**", "gap **0.61%**"),
    ("| 88.3 / 117.7 |", "| 88.3 / 111.7 |"),
    ("| 43 / 47.5 |", "| 43 / 49.5 |"),
    ("| rope (in place vs HF out of place) | 6.68x |", "| rope (in place vs HF out of place) | 6.88x |"),
    ("748 vs 752 TFLOP/s", "748 vs 762 TFLOP/s"),
])
def test_a_hand_edited_table_figure_fails_the_check(old, new):
    text = docs_text()
    assert old in text, "README.md / docs/HISTORY.md changed: pick another figure for this test"
    assert unsourced_figures(text.replace(old, new, 1))


def test_prose_outside_tables_is_not_checked():
    text = docs_text() + "\n\nA new section quoting 12345.678 us and 99.99% of nothing.\n"
    assert not unsourced_figures(text)


def test_a_hand_edited_figure_is_caught():
    # the check is not vacuous: figures next to real ones are not "found" by accident
    speed = stored_numbers(sources("benchmark"))
    assert _held(speed, "0.142", False) and _held(speed, "0.19", True) and _held(speed, "1.42", False)
    assert not _held(speed, "0.143", False)
    assert not _held(speed, "0.186", True)
    assert not _held(speed, "1.47", False)
    strategies = stored_numbers(sources("space (valid configs)"))
    assert _held(strategies, "88.3", False) and not _held(strategies, "88.4", False)
    memory = stored_numbers(sources("memory-bound op, earlier sweep"))
    assert _held(memory, "73.2", True) and not _held(memory, "73.3", True)


def test_figures_parser():
    assert figures("tiletune 3.69 s vs `exhaustive_search` 26.03 s: ratio **0.142**") == [
        ("3.69", False), ("26.03", False), ("0.142", False)]
    assert figures("gap **0.17%** (same config)") == [("0.17", True)]
    assert figures("0.92-1.05x for M >= 1024 except 1024x4096x4096 at 0.64x; fp16 GEMM 4096^3, 16x1024^3") == [
        ("0.92", False), ("1.05", False), ("1024", False), ("0.64", False)]
    tables = readme_tables("text\n\n| a | b |\n|---|---|\n| x | 1.5 |\n| y | 2 |\n\nmore | text\n")
    assert tables == [(["a", "b"], [["x", "1.5"], ["y", "2"]])]
