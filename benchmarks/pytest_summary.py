"""A GPU test run's outcome as a result file: the counts of pytest's summary line and the failed tests' ids.

The GPU sessions keep pytest's own output (``-v`` or ``-q``) under ``results/<gpu>/logs/``; the tables of
docs/HISTORY.md quote its counts, which must come from JSON result files. This reads one or more such
outputs and writes one JSON file::

    python pytest_summary.py --out results/h100/gpu_suite_2026-12-07.json \\
        --gpu "NVIDIA H100 80GB HBM3" --driver 580.159.04 --date 2026-12-07T23:16Z \\
        suite1=logs/pytest_gpu_suite1_2026-12-07_2316.txt.gz bg=logs/pytest_gpu_bg_2026-12-07_2310.txt.gz

Each ``NAME=PATH`` (``.gz`` read as gzip) becomes ``runs[NAME]``: ``passed``, ``failed``, ``skipped``,
``errors``, ``deselected``, ``seconds`` (pytest's own), ``tests`` (passed + failed + errors), ``failed_tests``
(the ids pytest listed as FAILED or ERROR).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path
from typing import Any

_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)")
_SECONDS = re.compile(r" in ([0-9.]+)s")


def _text(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.name.endswith(".gz") else data).decode("utf-8", "replace")


def summarize(text: str) -> dict[str, Any]:
    """The counts of the last summary line of a pytest output, and the failed tests' ids."""
    summary = None
    for line in text.splitlines():
        s = line.strip().strip("=").strip()
        if _COUNT.search(s) and _SECONDS.search(s) and re.search(r"\b(passed|failed|deselected|error)", s):
            summary = s
    if summary is None:
        raise ValueError("no pytest summary line (N passed ... in S s) in this output")
    out: dict[str, Any] = {k: 0 for k in ("passed", "failed", "skipped", "errors", "deselected")}
    for n, what in _COUNT.findall(summary):
        key = {"error": "errors", "warning": "warnings"}.get(what, what)
        out[key] = int(n)
    out["seconds"] = float(_SECONDS.search(summary).group(1))
    out["tests"] = out["passed"] + out["failed"] + out["errors"]
    failed: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^(FAILED|ERROR) (\S+)", line)
        if m and m.group(2) not in failed:
            failed.append(m.group(2))
    out["failed_tests"] = failed
    out["summary_line"] = summary
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="NAME=PATH of a pytest output (.gz read as gzip)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", default=None)
    ap.add_argument("--driver", default=None)
    ap.add_argument("--date", default=None)
    args = ap.parse_args(argv)
    runs = {}
    for spec in args.runs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            ap.error(f"{spec!r}: expected NAME=PATH")
        runs[name] = dict(summarize(_text(Path(path))), log=Path(path).name)
    doc = {"benchmark": "pytest_summary", "gpu": args.gpu, "driver": args.driver, "date": args.date, "runs": runs}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for name, r in runs.items():
        print(f"{name}: {r['summary_line']}")


if __name__ == "__main__":
    main()
