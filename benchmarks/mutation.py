#!/usr/bin/env python
"""Mutation testing of the core (issue 21): ``stats``, ``verify``, ``keys`` and ``store``.

Runs mutmut (3.x) over each module against its own CPU test files, in a scratch copy of the
repository (the working tree is never mutated: other people edit it), and writes
``benchmarks/results/mutation.json.gz`` (gzipped JSON; any other name: plain JSON)::

    {"tool", "tool_version", "date", "commit", "modules", "mutants", "killed", "score",
     "equivalent", "score_excluding_equivalent", "unexplained",
     "per_module": {module: {"mutants", "killed", "survived", "timeout", "other", "score",
                             "equivalent", "score_excluding_equivalent", "tests", "wall_s"}},
     "survivors": [{"module", "line", "mutation", "original", "mutated", "mutant", "status",
                    "explanation"}]}

``killed`` counts mutants that made a test fail or time out (mutmut's own score does the same);
``score = killed / mutants`` over mutants that were run (mutmut's "no tests" and "skipped" count
as not killed). Every survivor gets an explanation written by hand (:data:`EXPLANATIONS` by exact
line, :data:`PATTERN_EXPLANATIONS` by rule): an equivalent mutant ("equivalent: ..."), why it is
not worth a test, or an open gap; a survivor without one is reported as ``"UNEXPLAINED"`` so a new
gap is visible. The scratch copy is of the working tree (tracked and untracked files), with
mutmut's own configuration appended to its pyproject.toml.

Not run in CI (minutes per module on 2 cores)::

    python benchmarks/mutation.py                      # all four modules
    python benchmarks/mutation.py --modules stats keys # a subset; merges into the existing JSON
    python benchmarks/mutation.py --keep DIR           # keep the scratch copy in DIR (for `mutmut show`)
    python benchmarks/mutation.py --reexplain          # re-apply the explanations to the JSON
    python benchmarks/mutation.py --modules store --tests tests/test_store.py \
        --mutants-file names.txt                       # only the named mutants, merged into the module's
                                                       # entry (each must be one the JSON counts as not
                                                       # run, or one of its survivors: re-run after new
                                                       # tests); recorded under per_module[m]["reruns"]

Needs ``pip install mutmut`` (and the test extra) in the running interpreter's environment.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "mutation.json.gz"


def _write(out: Path, doc: dict) -> None:
    text = json.dumps(doc, indent=1) + "\n"
    if out.name.endswith(".gz"):
        import gzip

        out.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        out.write_text(text)

#: Module -> its CPU test files (missing ones are left out and named in the result).
TESTS: dict[str, list[str]] = {
    "stats": ["tests/test_stats.py", "tests/test_tuner_showdown.py"],
    "verify": ["tests/test_verify.py"],
    "keys": ["tests/test_keys.py", "tests/test_hotpath.py"],
    "store": ["tests/test_store.py", "tests/test_leases.py"],
}

#: Hand-written explanations of surviving mutants: (module, the mutated source line stripped, the
#: mutant's line stripped) -> why no test kills it. Matched on the text, not the line number, so the
#: mapping survives edits elsewhere in the module.
EXPLANATIONS: dict[tuple[str, str, str], str] = {}

#: Explanations of single mutants by their mutmut name, checked first: for a line whose text occurs in
#: more than one place (or whose rule above would be wrong for it). mutmut numbers the mutants of a
#: function in order, so these hold while the function's source is unchanged.
MUTANT_EXPLANATIONS: dict[str, str] = {
    "tiletune.store.xǁTuningDBǁ_connect__mutmut_53":
        "equivalent: the ROLLBACK after a failed migration fails (suppressed), but the outer handler "
        "closes the connection at once, and closing rolls its open transaction back "
        "(test_failed_migration_leaves_the_file_as_it_was: still version 1, no new tables)",
    "tiletune.store.xǁTuningDBǁ_enable_wal__mutmut_27":
        "not worth a test: breaks only the 'busy' alternative of the retry condition ('BUSY' is never in "
        "the lowercased text); SQLite words the lock conflict of switching to WAL as 'database is locked', "
        "the case test_enable_wal_retries_while_another_connection_holds_the_lock covers",
    "tiletune.store.xǁTuningDBǁ_enable_wal__mutmut_10":
        "equivalent: the lowercased journal mode never equals 'WAL', so the mode is always set to WAL "
        "again, which is idempotent",
    "tiletune.store.xǁTuningDBǁstats__mutmut_20":
        "equivalent: stats' own connection stays open in WAL mode, and SQLite keeps the -wal file while "
        "any connection is open, so getsize of it does not fail (the rule by text would call this the "
        "temp-file cleanup of _atomic_write)",
}


def _case_only(original: str, mutated: str) -> bool:
    return original != mutated and original.lower() == mutated.lower()


#: Survivors explained by a rule over (module, original line, mutant line): (module, predicate, text).
PATTERN_EXPLANATIONS: list[tuple[str, object, str]] = [
    ("store", lambda o, m: _case_only(o, m) and not re.search(r"raise|_Invalid\(|Error\(", o),
     "equivalent: only the case changed of SQL text, a sqlite3.Row key or a codec name; SQLite "
     "keywords and identifiers, sqlite3.Row keys and Python codec names are case-insensitive"),
    ("store", lambda o, m: "zip(_IDENTITY_COLUMNS[:-1], values[:-1])" in o,
     "equivalent: dropping one more identity column from the filter keeps 'digest', a hash of all the "
     "others, so the same rows are selected"),
    ("store", lambda o, m: "None if s.winner is None else canonical_json(s.winner)" in o,
     "equivalent: stores the JSON text 'null' instead of SQL NULL for a session without winner; every "
     "reader decodes both to None"),
    ("store", lambda o, m: o.startswith("1 if m.is_baseline else 0"),
     "equivalent: is_baseline is read back with bool(), and bool(2) is True"),
    ("store", lambda o, m: o.startswith("stable_hash(config)") or o.startswith("stable_hash(s.winner)"),
     "gap, not worth a test: the config_hash columns are written for SQL inspection and read by no "
     "store API (lookups go by digest and config JSON)"),
    ("store", lambda o, m: "_as_str(_need(" in o and ", None)" in m,
     "gap: the where-text of a wrong-typed identity string field (kernel_id, space_hash, device "
     "name/arch, versions) is not pinned; MORE_MALFORMED covers key and name only"),
    ("store", lambda o, m: 'ident.get("name", "")' in o,
     "gap: the default name of an imported identity without one is not checked (test_import_accepts_"
     "the_limits imports it but does not read the name back)"),
    ("store", lambda o, m: o == "median = None",
     "gap: a session without winner imported with median '' instead of None is not read back by a test"),
    ("store", lambda o, m: "parameter names must be strings" in o,
     "equivalent: unreachable (pragma: no cover), JSON object keys are always strings"),
    ("store", lambda o, m: "tempfile.mkstemp(" in o,
     "equivalent for the result: the temporary file's prefix, suffix and directory only name the file "
     "that os.replace then moves onto the target (a temp file in /tmp would break only across mounts)"),
    ("store", lambda o, m: 'encoding="utf-8"' in o,
     "equivalent here: 'UTF-8' is the same codec and UTF-8 is this platform's default encoding"),
    ("store", lambda o, m: "contextlib.suppress(OSError)" in o or "os.unlink(tmp)" in o,
     "not worth a test: removes the temporary file after a write that failed midway (needs an OSError "
     "injected between mkstemp and os.replace); the export itself is still atomic"),
    ("store", lambda o, m: "timeout=BUSY_TIMEOUT_MS / 1000" in o and "isolation_level=None" in m,
     "equivalent: the PRAGMA busy_timeout = BUSY_TIMEOUT_MS that _connect runs before any other statement "
     "replaces the busy handler sqlite3.connect's timeout installed (both are sqlite3_busy_timeout; "
     "test_fresh_file_gets_the_whole_schema_and_connection_settings reads it back)"),
    ("store", lambda o, m: "isolation_level=None" in o and "isolation_level" not in m,
     "equivalent here: every statement that writes runs inside an explicit BEGIN, so the sqlite3 "
     "module's implicit transactions never start"),
    ("store", lambda o, m: "version < SCHEMA_VERSION" in o,
     "equivalent: migrating a database that is already at SCHEMA_VERSION is a no-op (CREATE ... IF NOT "
     "EXISTS, guarded ALTERs)"),
    ("store", lambda o, m: "contextlib.suppress(sqlite3.Error)" in o or '"ROLLBACK"' in o,
     "not worth a test: cleanup when ROLLBACK or close itself fails after a failed migration or on a "
     "broken connection"),
    ("store", lambda o, m: "self._conns.pop(threading.get_ident()" in o or o == "if conn is not None:",
     "not worth a test: drops a finished thread's connection; a mutant only leaks one connection"),
    ("store", lambda o, m: "BUSY_TIMEOUT_MS / 1000" in o and "deadline" in o or "time.monotonic() > deadline" in o
     or "time.sleep(0.01)" in o or '"locked" not in str(e)' in o,
     "not worth a test: the retry loop for switching to WAL while another connection holds a lock; "
     "test_enable_wal_retries_while_another_connection_holds_the_lock covers a 'database is locked' "
     "retry that succeeds within the deadline; what is left changes the 30 s deadline (its length, > or "
     ">=), the 10 ms sleep or the 'busy' alternative, seen only in timing or with a lock held past 30 s"),
    ("store", lambda o, m: '.lower() == "wal"' in o,
     "equivalent: when the check fails the journal mode is set to WAL again, which is idempotent"),
    ("verify", lambda o, m: 'float("nan")' in o and 'float("NAN")' in m,
     "equivalent: float() parses 'NAN' as NaN too"),
    ("verify", lambda o, m: 'float("inf")' in o and 'float("INF")' in m,
     "equivalent: float() parses 'INF' as infinity too"),
    ("verify", lambda o, m: o == "if e <= 0.0:" and m == "if e < 0.0:",
     "equivalent: a non-float dtype (e = 0) then takes the general path with ec = min(e, ec) = 0, where "
     "every term is 0.0: the same all-zero Tolerance (for finite length and exp_range)"),
    ("verify", lambda o, m: o == "if e < ec:" and m == "if e <= ec:",
     "equivalent: when e == ec, setting ec = e changes nothing"),
    ("verify", lambda o, m: o.startswith("return Tolerance(rtol=ulps * e + c, atol=0.0,") and ", atol=0.0," not in m
     and "agg_atol=0.0" in m,
     "equivalent: atol defaults to 0.0 in Tolerance"),
    ("verify", lambda o, m: o.startswith('inf = torch.tensor(float("inf")') and "device=x.device" not in m,
     "not testable on CPU: the tests' tensors are on the CPU, the default device; the device only matters "
     "for a GPU x (exp_range there runs through the ops' softmax_tolerance in the GPU tests)"),
    ("verify", lambda o, m: o.startswith('inf = torch.tensor(float("inf")') and "dtype=x.dtype" not in m,
     "equivalent: a 0-d float32 tensor does not change the result dtype of torch.where with a floating x "
     "(0-d tensors do not promote within a category), and +-inf is +-inf in every floating dtype"),
    ("verify", lambda o, m: o.startswith("spread = ") and ".clamp_(None, cap)" in m,
     "equivalent: after nan_to_num no spread is negative (a row with a finite value has max >= min, a row "
     "without one gives -inf, mapped to 0)"),
    ("verify", lambda o, m: o.startswith("spread = ") and ".nan_to_num_(None, 0.0, 0.0)" in m,
     "equivalent: nan=None maps NaN to 0.0 too"),
    ("verify", lambda o, m: o.startswith("spread = ") and (".nan_to_num_(0.0, 0.0, None)" in m
                                                          or ".nan_to_num_(0.0, 0.0)." in m
                                                          or ".nan_to_num_(0.0, 0.0, )." in m),
     "equivalent: -inf (a row without finite values) then becomes the most negative float instead of 0, "
     "which clamp_(0.0, cap) maps to 0 again; NaN and +inf still go to 0"),
    ("verify", lambda o, m: o.startswith("spread = ") and (".nan_to_num_(0.0, None, 0.0)" in m
                                                          or ".nan_to_num_(0.0, 1.0, 0.0)" in m),
     "not killed on purpose (bug reported): +inf arises only when a row's max - min overflows float32 "
     "(values near +-3.4e38, or float64 values beyond float32's range); the original maps it to 0 where "
     "the docstring promises cap (exp_range([[-3e38, 3e38]]) == 0.0), this mutant gives cap (None) or 1; "
     "a test would pin the wrong value"),
    ("verify", lambda o, m: o == 'elif str(t.dtype) == "torch.bool":' and "!=" not in m,
     "equivalent: a bool tensor then takes the integer branch, and fill_(INT_SENTINEL) on a bool tensor "
     "stores True (nonzero), the same as fill_(True)"),
    ("verify", lambda o, m: o == "want = torch.as_tensor(want, device=got.device)",
     "not testable on CPU: every tensor of the tests is on the CPU, the default device; the device= moves "
     "a reference computed on another device onto the output's"),
    ("verify", lambda o, m: o.startswith("work = torch.float64 if") and "or True" in m,
     "not worth a test: float64 arithmetic for every output evaluates the same rule more precisely than "
     "float32 (differences below float32's rounding of a bound); a test would pin float32 rounding, an "
     "implementation detail"),
    ("verify", lambda o, m: o == "g = got.to(work)" and m == "g = got.to(None)",
     "equivalent: got in its own dtype (at most as wide as the working dtype) holds the same values, and "
     "every use of g (isfinite, isnan, g - w, g != wr) promotes to the working dtype of w"),
    ("verify", lambda o, m: o.startswith("wr = want.to(got.dtype).to(work)"),
     "equivalent: wr is used only in isfinite, isnan and g != wr, which promote; converting it to the "
     "working dtype changes no value"),
    ("verify", lambda o, m: o == "if not bool(both.all()):" and m == "if not bool(None):",
     "equivalent: with every element finite the NaN/Inf checks count 0 (line 322), and filtering by an "
     "all-true mask keeps every element, flattened (line 336; the script places both at 322)"),
    ("verify", lambda o, m: o.startswith("inf_bad = ") and "~(g_nan | w_nan)" in m,
     "equivalent: at that point g is NaN exactly where wr is (the two checks above returned otherwise), "
     "so g_nan & w_nan == g_nan | w_nan"),
    ("verify", lambda o, m: o.startswith("i = int(torch.argmax(") and "(err + bound)" in m,
     "equivalent: (err + bound) / bound and (err - bound) / bound differ by the constant 2, so argmax picks "
     "the same worst element (only named in the message)"),
    ("verify", lambda o, m: (o.startswith("agg = tol.agg if") or o.startswith("agg_atol = tol.agg_atol if"))
     and "or True" in m,
     "equivalent: tolerance_for always returns float agg and agg_atol (never None), so the fallback is "
     "never taken in compare_tensors"),
    ("stats", lambda o, m: "math.isfinite(candidate.ci_low) and math.isfinite(best.ci_high)" in o,
     "equivalent: with an infinite bound the final comparison (ci_low > ci_high * (1 + margin)) is False "
     "anyway, so the guard only saves the arithmetic"),
]


def finalize(doc: dict) -> dict:
    """Counts that depend on the explanations: unexplained survivors, and per module and overall the
    score over non-equivalent mutants (a survivor explained as "equivalent" cannot be killed)."""
    surv = doc["survivors"]
    doc["unexplained"] = sum(sv["explanation"] == "UNEXPLAINED" for sv in surv)
    eq_total = 0
    for module, c in doc["per_module"].items():
        eq = sum(sv["module"] == module and sv["explanation"].startswith("equivalent") for sv in surv)
        c["equivalent"] = eq
        c["score_excluding_equivalent"] = round(c["killed"] / (c["mutants"] - eq), 4) if c["mutants"] > eq else None
        eq_total += eq
    if doc.get("mutants"):
        doc["equivalent"] = eq_total
        doc["score_excluding_equivalent"] = round(doc["killed"] / (doc["mutants"] - eq_total), 4)
    return doc


def _run(cmd: list[str], cwd: Path, log, timeout: float | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # Tests that start child interpreters without site processing (test_leases: python -S) import the
    # mutated modules, whose trampolines import mutmut: name its site-packages for them.
    import mutmut

    env["PYTHONPATH"] = str(Path(mutmut.__file__).resolve().parents[1])
    # mutmut forks a test process per mutant: an OpenMP pool that torch started in the parent hangs
    # the child's first parallel op (every test_verify mutant timed out), so one thread each
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    env["TILETUNE_DB"] = str(cwd / "scratch-tuning.db")
    env["TILETUNE_CACHE_DIR"] = str(cwd / "scratch-cache")
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    log.write(f"$ {' '.join(cmd)}\n{p.stdout}\n")
    log.flush()
    return p


def scratch_copy(dest: Path) -> None:
    """Copy the working tree's tracked and untracked-but-not-ignored files into ``dest``."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           stdout=subprocess.PIPE).stdout.decode().split("\0")
    for rel in files:
        if not rel:
            continue
        src = ROOT / rel
        if not src.is_file():
            continue
        if rel.endswith((".png", ".gz")) and not rel.startswith(("src/", "tests/")):
            continue  # result plots and recordings: no test of these modules reads them
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def mutmut_config(module: str, tests: list[str]) -> str:
    sel = ", ".join(json.dumps(t) for t in tests)
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["src/"]\n'
        f'only_mutate = ["src/tiletune/{module}.py"]\n'
        f"pytest_add_cli_args_test_selection = [{sel}]\n"
        'pytest_add_cli_args = ["-x", "-q", "-p", "no:cacheprovider", "-m", "not gpu"]\n'
        "use_git_change_detection = false\n"
        # tests import helpers from these folders (test_verify: benchmarks/planted_bugs.py)
        'also_copy = ["benchmarks/", "tools/"]\n'
    )


def explain(module: str, original: str, mutant: str, name: str = "") -> str:
    if name in MUTANT_EXPLANATIONS:
        return MUTANT_EXPLANATIONS[name]
    key = (module, original.strip(), mutant.strip())
    if key in EXPLANATIONS:
        return EXPLANATIONS[key]
    for mod, rule, text in PATTERN_EXPLANATIONS:
        if mod == module and rule(original.strip(), mutant.strip()):
            return text
    return "UNEXPLAINED"


def parse_diff(diff: str) -> tuple[list[str], list[str]]:
    removed = [l[1:] for l in diff.splitlines() if l.startswith("-") and not l.startswith("---")]
    added = [l[1:] for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")]
    return removed, added


def diff_offset(diff: str) -> int | None:
    """Offset of the first removed line from the first line of the function mutmut's diff shows."""
    k = 0
    started = False
    for l in diff.splitlines():
        if l.startswith("@@"):
            # the hunk may start inside the function: "@@ -5,4 +5,4 @@" is its 5th line
            m = re.match(r"@@ -(\d+)", l)
            k = int(m.group(1)) - 1 if m else 0
            started = True
            continue
        if not started or l.startswith("+"):
            continue
        if l.startswith("-"):
            return k
        k += 1
    return None


def line_of(source_lines: list[str], removed: list[str], func: str, offset: int | None = None) -> int | None:
    """1-based line of the first removed line: the mutated function's ``def`` plus the diff's offset,
    else the first equal line after the ``def``."""
    if not removed:
        return None
    start = 0
    # mutant names: "tiletune.stats.x_rank__mutmut_3", "tiletune.stats.xǁStoppingRuleǁdecide__mutmut_7"
    name = re.sub(r"__mutmut_\d+$", "", func.rsplit(".", 1)[-1])
    name = name.rsplit("ǁ", 1)[-1] if "ǁ" in name else name[2:] if name.startswith("x_") else None
    if name:
        for i, l in enumerate(source_lines):
            if re.match(rf"\s*(async\s+)?def {re.escape(name)}\(", l):
                start = i
                break
    # compared stripped: mutmut shows a method's body dedented by one level
    target = removed[0].strip()
    if name and offset is not None and 0 <= start + offset < len(source_lines) and \
            source_lines[start + offset].strip() == target:
        return start + offset + 1
    for i in range(start, len(source_lines)):
        if source_lines[i].strip() == target:
            return i + 1
    for i, l in enumerate(source_lines):
        if l.strip() == target:
            return i + 1
    return None


def func_of(mutant: str) -> str:
    """``tiletune.store.xǁTuningDBǁ_connect__mutmut_3`` -> ``TuningDB._connect``."""
    return re.sub(r"__mutmut_\d+$", "", mutant.rsplit(".", 1)[-1]).replace("ǁ", ".").lstrip("x_.")


def merge_rerun(prev: dict, new: dict, names: list[str], tests: list[str], prev_survivors: list[dict]) -> dict:
    """Merge a run of the named mutants into the module's earlier entry. Only mutants the earlier run
    left out (its ``not_run_by_function``) or reported as survivors (``prev_survivors``: their old
    results are taken out first) are allowed, so that no mutant is counted twice."""
    left = dict(prev.get("not_run_by_function", {}))
    old_status = {sv["mutant"]: sv["status"] for sv in prev_survivors}
    merged = dict(prev)
    n_survivors = 0
    for n in names:
        if n in old_status:
            merged["mutants"] -= 1
            merged["survived" if old_status[n] == "survived" else "other"] -= 1
            n_survivors += 1
            continue
        f = func_of(n)
        if left.get(f, 0) <= 0:
            raise SystemExit(f"{n}: neither left out nor a survivor of the earlier run of this module")
        left[f] -= 1
    ran = new["mutants"]
    for k in ("mutants", "killed", "survived", "timeout", "other"):
        merged[k] = merged.get(k, 0) + new[k]
    merged["score"] = round(merged["killed"] / merged["mutants"], 4) if merged["mutants"] else None
    # named mutants that this run did not check either stay not run
    still = new.get("not_run_by_function", {})
    left = {f: c + still.get(f, 0) for f, c in left.items() if c + still.get(f, 0)}
    merged["not_run"] = sum(left.values())
    if left:
        merged["not_run_by_function"] = left
    else:
        merged.pop("not_run_by_function", None)
    merged.setdefault("reruns", []).append({
        "mutants": ran, "killed": new["killed"], "survived": new["survived"], "other": new["other"],
        "of_which_earlier_survivors": n_survivors,
        "functions": sorted({func_of(n) for n in names}), "tests": tests, "wall_s": new["wall_s"],
        "names": sorted(names),
    })
    return merged


def run_module(module: str, work: Path, log, max_children: int, collect_only: bool = False,
               tests_override: list[str] | None = None, mutant_names: list[str] | None = None) -> dict:
    repo = work / module
    if not collect_only:
        scratch_copy(repo)
    wanted = tests_override or TESTS[module]
    tests = [t for t in wanted if (repo / t).is_file()]
    missing = [t for t in wanted if t not in tests]
    if not tests:
        return {"module": module, "skipped": f"no test files ({', '.join(missing)} missing)"}
    t0 = time.time()
    if not collect_only:
        with open(repo / "pyproject.toml", "a") as f:
            f.write(mutmut_config(module, tests))
        p = _run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children),
                  *(mutant_names or [])], repo, log)
        if p.returncode != 0:
            raise RuntimeError(f"mutmut run failed for {module} (see the log):\n{p.stdout[-3000:]}")
    wall = time.time() - t0
    res = _run([sys.executable, "-m", "mutmut", "results", "--all", "true"], repo, log)
    statuses: dict[str, str] = {}
    for line in res.stdout.splitlines():
        m = re.match(r"\s+(\S+): (.+)$", line)
        if m:
            statuses[m.group(1)] = m.group(2).strip()
    source_lines = (repo / "src" / "tiletune" / f"{module}.py").read_text().splitlines()
    counts = {"mutants": 0, "killed": 0, "survived": 0, "timeout": 0, "other": 0, "not_run": 0}
    survivors = []
    not_run_funcs: dict[str, int] = {}
    for name, status in sorted(statuses.items()):
        if mutant_names is not None and name not in mutant_names:
            continue  # a run of named mutants: the others keep their results of the earlier run
        if status == "not checked":  # a run stopped early (--collect of an interrupted run)
            counts["not_run"] += 1
            func = func_of(name)
            not_run_funcs[func] = not_run_funcs.get(func, 0) + 1
            continue
        counts["mutants"] += 1
        if status in ("killed", "timeout", "caught by type check"):
            counts["killed"] += 1
            if status == "timeout":
                counts["timeout"] += 1
            continue
        if status == "survived":
            counts["survived"] += 1
        else:
            counts["other"] += 1
        diff = _run([sys.executable, "-m", "mutmut", "show", name], repo, log).stdout
        removed, added = parse_diff(diff)
        original = removed[0] if removed else ""
        mutated = added[0] if added else ""
        survivors.append({
            "module": module,
            "line": line_of(source_lines, removed, name, diff_offset(diff)),
            "mutation": f"{original.strip()}  ->  {mutated.strip()}" if removed or added else name,
            "original": original.strip(),
            "mutated": mutated.strip(),
            "mutant": name,
            "status": status,
            "explanation": explain(module, original, mutated, name),
        })
    counts["score"] = round(counts["killed"] / counts["mutants"], 4) if counts["mutants"] else None
    if not_run_funcs:
        counts["not_run_by_function"] = not_run_funcs
    counts["tests"] = tests
    if missing:
        counts["tests_missing"] = missing
    counts["wall_s"] = round(wall, 1)
    return {"module": module, "counts": counts, "survivors": survivors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", nargs="+", default=list(TESTS), choices=list(TESTS))
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--keep", default=None, help="scratch directory to keep (default: a temporary one)")
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--collect", action="store_true",
                    help="collect the results already in --keep DIR (e.g. of an interrupted run) without running")
    ap.add_argument("--reexplain", action="store_true",
                    help="only re-apply EXPLANATIONS to the survivors of the existing JSON (no mutmut run)")
    ap.add_argument("--tests", nargs="+", default=None,
                    help="test files for the module(s), instead of TESTS[module]")
    ap.add_argument("--mutants-file", default=None,
                    help="run only the mutants named in this file (one full mutmut name a line, e.g. "
                         "tiletune.store.xǁTuningDBǁ_connect__mutmut_3), each left out or survived by the earlier run "
                         "of the one module given; their results are merged into its entry")
    args = ap.parse_args()
    names = None
    if args.mutants_file:
        if len(args.modules) != 1:
            ap.error("--mutants-file needs exactly one module")
        names = [l.strip() for l in Path(args.mutants_file).read_text().splitlines() if l.strip()]
    if args.reexplain:
        out = Path(args.out)
        doc = json.loads(out.read_text())
        for sv in doc["survivors"]:
            sv["explanation"] = explain(sv["module"], sv.get("original", ""), sv.get("mutated", ""), sv["mutant"])
        finalize(doc)
        _write(out, doc)
        print(f"re-explained {len(doc['survivors'])} survivors, {doc['unexplained']} unexplained")
        return 0
    import mutmut

    version = getattr(mutmut, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("mutmut")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tiletune-mutation-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.is_file() else {}
    per_module = dict(previous.get("per_module", {}))
    survivors = [s for s in previous.get("survivors", []) if s["module"] not in args.modules or names]
    skipped = {}
    with open(work / "mutation.log", "a") as log:
        for module in args.modules:
            print(f"mutating {module} ...", flush=True)
            try:
                r = run_module(module, work, log, args.max_children, collect_only=args.collect,
                               tests_override=args.tests, mutant_names=names)
            except RuntimeError as exc:
                skipped[module] = str(exc).splitlines()[0]
                print(f"  failed: {exc}", flush=True)
                continue
            if "skipped" in r:
                skipped[module] = r["skipped"]
                print(f"  skipped: {r['skipped']}", flush=True)
                continue
            if names:
                if module not in per_module:
                    raise SystemExit(f"--mutants-file: no earlier entry for {module} to merge into")
                earlier = [sv for sv in survivors if sv["module"] == module]
                per_module[module] = merge_rerun(per_module[module], r["counts"], names, r["counts"]["tests"],
                                                 earlier)
                survivors = [sv for sv in survivors if sv["module"] != module or sv["mutant"] not in names]
            else:
                per_module[module] = r["counts"]
            survivors += r["survivors"]
            c = r["counts"]
            print(f"  {c['killed']}/{c['mutants']} killed ({c['score']:.1%}), {c['wall_s']} s", flush=True)
    modules = [m for m in TESTS if m in per_module]
    mutants = sum(per_module[m]["mutants"] for m in modules)
    killed = sum(per_module[m]["killed"] for m in modules)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True).stdout.strip()
    doc = {
        "tool": "mutmut",
        "tool_version": version,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "python": sys.version.split()[0],
        "modules": modules,
        "mutants": mutants,
        "killed": killed,
        "score": round(killed / mutants, 4) if mutants else None,
        "target": 0.9,
        "per_module": per_module,
        "not_run": skipped or None,
        "notes": previous.get("notes"),
        "unexplained": sum(sv["explanation"] == "UNEXPLAINED" for sv in survivors),
        "survivors": sorted(survivors, key=lambda s: (modules.index(s["module"]), s["line"] or 0)),
    }
    finalize(doc)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write(out, doc)
    print(f"wrote {out}: {killed}/{mutants} killed ({doc['score']:.1%})" if mutants else f"wrote {out}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
