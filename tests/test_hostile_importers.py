"""Hostile input for the importers (issue 15): Kernel Tuner caches, T4 files, tiletune recordings and
``TuningDB.import_json``/``export_json``.

Every refused input asserts the exact exception class and message (file and field path included),
that nothing was written (no output file, an existing destination byte-identical, no temporary file
left) and, for ``db import``, that the database's records are unchanged.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import os
import pathlib
from typing import Any, Callable

import pytest

from tiletune.errors import (
    DatabaseError,
    ExportError,
    InvalidImport,
    InvalidRecording,
    OutputError,
    TiletuneError,
)
from tiletune import jsonio as _io
from tiletune.lab.recordings import Recording, import_recording, load_any, save_recording
from tiletune.records import DeviceInfo, Measurement, Status, TuningIdentity
from tiletune.store import TuningDB

# ---------------------------------------------------------------------- sample documents

KT: dict[str, Any] = {
    "schema_version": "1.1.0",
    "device_name": "NVIDIA A100-PCIE-40GB",
    "kernel_name": "vector_add",
    "problem_size": [1000000],
    "tune_params_keys": ["block_size_x", "block_size_y"],
    "tune_params": {"block_size_x": [32, 64, 128], "block_size_y": [1, 2, 4]},
    "objective": "time",
    "cache": {
        "32,1": {"block_size_x": 32, "block_size_y": 1, "time": 0.25, "times": [0.26, 0.25, 0.25, 0.24],
                 "compile_time": 812.5, "timestamp": "2024-01-02 10:00:00+00:00"},
        "64,1": {"block_size_x": 64, "block_size_y": 1, "time": 0.125, "compile_time": 801.0,
                 "timestamp": "2024-01-02 10:00:02+00:00"},
        "64,2": {"block_size_x": 64, "block_size_y": 2, "time": "CompilationFailedConfig", "compile_time": 300.0,
                 "timestamp": "2024-01-02 10:00:03+00:00"},
        "64,4": {"block_size_x": 64, "block_size_y": 4, "time": "InvalidConfig", "compile_time": 0,
                 "timestamp": "2024-01-02 10:00:04+00:00"},
        "128,1": {"block_size_x": 128, "block_size_y": 1, "time": "RuntimeFailedConfig", "compile_time": 805.0,
                  "timestamp": "2024-01-02 10:00:05+00:00"},
    },
}

T4: dict[str, Any] = {
    "schema_version": "1.0.0",
    "results": [
        {"timestamp": "2023-12-21 10:44:42+00:00", "configuration": {"block_size_x": 16, "tile_size_x": 1},
         "times": {"compilation": 661.5, "runtimes": [12.26, 12.25, 12.27]},
         "invalidity": "correct", "correctness": 1, "measurements": [], "objectives": ["time"]},
        {"timestamp": "2023-12-21 10:44:43+00:00", "configuration": {"block_size_x": 32, "tile_size_x": 1},
         "times": {"compilation_time": 640.0, "runtimes": []}, "invalidity": "correct", "correctness": 1,
         "measurements": [{"name": "time", "value": 9.5, "unit": "ms"}], "objectives": ["time"]},
        {"configuration": {"block_size_x": 32, "tile_size_x": 2}, "times": {"compilation": 700.0, "runtimes": ["x"]},
         "invalidity": "compile", "correctness": 0, "measurements": [{"name": "time", "value": "error"}]},
    ],
}

REC: dict[str, Any] = {
    "format": "tiletune-recording",
    "version": 1,
    "recorded": "2023-05-06T07:08:09Z",
    "name": "op",
    "key": {"M": 7},
    "device": {"name": "NVIDIA H200", "arch": "sm_90", "sm_count": 132},
    "versions": {"cuda_tile": "1.7.0"},
    "space": {},
    "note": "",
    "measurements": [
        {"config": {"T": 1}, "status": "ok", "reason": "", "samples_us": [10.5, 10.25], "compile_s": 0.5,
         "order": 0, "is_baseline": True},
        {"config": {"T": 2}, "status": "compile_error", "reason": "too big", "samples_us": [], "compile_s": None,
         "order": 1, "is_baseline": False},
    ],
}


def _strict_loads(text: str | bytes) -> Any:
    """json.loads that refuses NaN and Infinity (what a standard JSON reader accepts)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with ``value`` at ``path`` (``a/b/0``; ``None`` as value: JSON null);
    ``value`` may be a callable building the value from the old one."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split("/")
    node: Any = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    key: Any = int(last) if isinstance(node, list) else last
    node[key] = value(node.get(key) if isinstance(node, dict) else node[key]) if callable(value) else value
    return doc


def _drop(doc: dict[str, Any], path: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    *parents, last = path.split("/")
    node: Any = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    del node[last]
    return doc


def _raw(doc: dict[str, Any], path: str, literal: str) -> str:
    """The JSON text of ``doc`` with the raw text ``literal`` at ``path`` (for what json.dumps cannot
    write: NaN, 1e400, 10000 levels of nesting)."""
    marker = "@@RAW@@"
    text = json.dumps(_set(doc, path, marker))
    assert text.count(f'"{marker}"') == 1
    return text.replace(f'"{marker}"', literal)


DEEP = "[" * 10000 + "]" * 10000

# ---------------------------------------------------------------------- refused recorded spaces

#: case -> (content: str or bytes, field or None, problem). The file is called ``src.json``.
RECORDING_CASES: dict[str, tuple[str | bytes, str | None, str]] = {
    # numbers out of range
    "kt huge float as text": (_raw(KT, "cache/64,1/time", "1e400"), 'cache["64,1"].time',
                              "number out of range, got 1e400"),
    "kt huge integer": (_raw(KT, "cache/64,1/time", "1" + "0" * 400), 'cache["64,1"].time',
                        "integer out of range (it must fit in 64 bits), got 10000000000000000000...(401 characters)"),
    "kt huge integer in problem_size": (_set(KT, "problem_size", [2**64]), "problem_size[0]",
                                        "integer out of range (it must fit in 64 bits), got 18446744073709551616"),
    "kt time beyond the time limit": (_set(KT, "cache/64,1/time", 1e16), 'cache["64,1"].time',
                                      "out of range (a time must be below 1e+15), got 1e+16"),
    # deep nesting
    "kt deep nesting": (_raw(KT, "problem_size", DEEP), None,
                        "nested deeper than 64 levels"),
    "deep nesting alone": (DEEP, None, "nested deeper than 64 levels"),
    "deep nesting unterminated": ("[" * 10000, None, "nested deeper than 64 levels"),
    # Kernel Tuner times
    "kt times abc": (_set(KT, "cache/32,1/times/2", "abc"), 'cache["32,1"].times[2]',
                     'expected a finite positive number, got "abc"'),
    "kt times element null": (_set(KT, "cache/32,1/times/2", None), 'cache["32,1"].times[2]',
                              "expected a finite positive number, got null"),
    "kt times null": (_set(KT, "cache/32,1/times", None), 'cache["32,1"].times',
                      "expected a list of times, got null"),
    "kt times NaN": (_raw(KT, "cache/32,1/times/1", "NaN"), 'cache["32,1"].times[1]',
                     "expected a finite number, got NaN (NaN and Infinity are not standard JSON)"),
    "kt time Infinity": (_raw(KT, "cache/64,1/time", "Infinity"), 'cache["64,1"].time',
                         "expected a finite number, got Infinity (NaN and Infinity are not standard JSON)"),
    "kt time -Infinity": (_raw(KT, "cache/64,1/time", "-Infinity"), 'cache["64,1"].time',
                          "expected a finite number, got -Infinity (NaN and Infinity are not standard JSON)"),
    "kt time -1": (_set(KT, "cache/64,1/time", -1), 'cache["64,1"].time',
                   "expected a finite positive number (milliseconds) or a Kernel Tuner error string, got -1"),
    "kt time 0": (_set(KT, "cache/64,1/time", 0), 'cache["64,1"].time',
                  "expected a finite positive number (milliseconds) or a Kernel Tuner error string, got 0"),
    "kt time null": (_set(KT, "cache/64,1/time", None), 'cache["64,1"].time',
                     "expected a finite positive number (milliseconds) or a Kernel Tuner error string, got null"),
    "kt time true": (_set(KT, "cache/64,1/time", True), 'cache["64,1"].time',
                     "expected a finite positive number (milliseconds) or a Kernel Tuner error string, got true"),
    "kt times -1": (_set(KT, "cache/32,1/times/0", -1), 'cache["32,1"].times[0]',
                    "expected a finite positive number, got -1"),
    "kt times boolean": (_set(KT, "cache/32,1/times/3", False), 'cache["32,1"].times[3]',
                         "expected a finite positive number, got false"),
    "kt missing time": (_drop(KT, "cache/64,1/time"), 'cache["64,1"]', "missing field 'time'"),
    "kt compile_time text": (_set(KT, "cache/32,1/compile_time", "fast"), 'cache["32,1"].compile_time',
                             'expected a finite non-negative number, got "fast"'),
    "kt compile_time negative": (_set(KT, "cache/64,2/compile_time", -3), 'cache["64,2"].compile_time',
                                 "expected a finite non-negative number, got -3"),
    "kt timestamp not a string": (_set(KT, "cache/32,1/timestamp", 5), 'cache["32,1"].timestamp',
                                  "expected a string, got 5"),
    "kt config value an object": (_set(KT, "cache/32,1/block_size_x", {"a": 1}), 'cache["32,1"].block_size_x',
                                  "expected a number, string, boolean or null, got an object"),
    "kt device_name a number": (_set(KT, "device_name", 100), "device_name", "expected a string, got 100"),
    # Kernel Tuner structure
    "kt empty value list": (_set(KT, "tune_params/block_size_y", []), "tune_params.block_size_y",
                            "expected a non-empty list of values, got an empty list"),
    "kt empty tune_params": (_set(KT, "tune_params", {}), "tune_params",
                             "expected a non-empty object, got an empty object"),
    "kt empty tune_params_keys": (_set(KT, "tune_params_keys", []), "tune_params_keys",
                                  "expected a non-empty list of parameter names, got an empty list"),
    "kt unknown tune_params_key": (_set(KT, "tune_params_keys/1", "foo"), "tune_params_keys[1]",
                                   '"foo" is not a key of tune_params'),
    "kt cache a list": (_set(KT, "cache", []), "cache", "expected an object, got an empty list"),
    "kt entry a string": (_set(KT, "cache/32,1", "fast"), 'cache["32,1"]', 'expected an object, got "fast"'),
    "kt empty cache": (_set(KT, "cache", {}), None, "the recording has no configs to build a space from"),
    # T4
    "t4 runtimes abc": (_set(T4, "results/0/times/runtimes/1", "abc"), "results[0].times.runtimes[1]",
                        'expected a finite positive number, got "abc"'),
    "t4 runtimes -1": (_set(T4, "results/0/times/runtimes/1", -1), "results[0].times.runtimes[1]",
                       "expected a finite positive number, got -1"),
    "t4 runtimes NaN": (_raw(T4, "results/0/times/runtimes/1", "NaN"), "results[0].times.runtimes[1]",
                        "expected a finite number, got NaN (NaN and Infinity are not standard JSON)"),
    "t4 runtimes null": (_set(T4, "results/0/times/runtimes", None), "results[0].times.runtimes",
                         "expected a list, got null"),
    "t4 time measurement null": (_set(T4, "results/1/measurements/0/value", None),
                                 "results[1].measurements[0].value", "expected a finite positive number, got null"),
    "t4 compilation negative": (_set(T4, "results/0/times/compilation", -5), "results[0].times.compilation",
                                "expected a finite non-negative number, got -5"),
    "t4 correctness text": (_set(T4, "results/0/correctness", "yes"), "results[0].correctness",
                            'expected a number, got "yes"'),
    "t4 correctness boolean": (_set(T4, "results/0/correctness", True), "results[0].correctness",
                               "expected a number, got true"),
    "t4 invalidity a number": (_set(T4, "results/0/invalidity", 3), "results[0].invalidity",
                               "expected a string, got 3"),
    "t4 missing configuration": (_drop(T4, "results/1/configuration"), "results[1]",
                                 "missing field 'configuration'"),
    "t4 results an object": (_set(T4, "results", {}), "results", "expected a list, got an empty object"),
    "t4 result a number": (_set(T4, "results/2", 7), "results[2]", "expected an object, got 7"),
    "t4 no results": (_set(T4, "results", []), None, "the recording has no configs to build a space from"),
    # tiletune recordings
    "rec samples abc": (_set(REC, "measurements/0/samples_us/1", "abc"), "measurements[0].samples_us[1]",
                        'expected a finite positive number, got "abc"'),
    "rec samples negative": (_set(REC, "measurements/0/samples_us/0", -1.5), "measurements[0].samples_us[0]",
                             "expected a finite positive number, got -1.5"),
    "rec samples Infinity": (_raw(REC, "measurements/0/samples_us/1", "Infinity"), "measurements[0].samples_us[1]",
                             "expected a finite number, got Infinity (NaN and Infinity are not standard JSON)"),
    "rec compile_s text": (_set(REC, "measurements/0/compile_s", "0.5"), "measurements[0].compile_s",
                           'expected a finite non-negative number, got "0.5"'),
    "rec order float": (_set(REC, "measurements/1/order", 1.5), "measurements[1].order",
                        "expected an integer >= 0, got 1.5"),
    "rec order boolean": (_set(REC, "measurements/1/order", True), "measurements[1].order",
                          "expected an integer >= 0, got true"),
    "rec sm_count negative": (_set(REC, "device/sm_count", -1), "device.sm_count",
                              "expected an integer >= 0, got -1"),
    "rec baseline as 1": (_set(REC, "measurements/0/is_baseline", 1), "measurements[0].is_baseline",
                          "expected true or false, got 1"),
    "rec unknown status": (_set(REC, "measurements/1/status", "exploded"), "measurements[1].status",
                           '"exploded" is not one of compile_error, launch_error, mismatch, ok, timeout'),
    "rec config value a list": (_set(REC, "measurements/0/config/T", [1]), "measurements[0].config.T",
                                "expected a number, string, boolean or null, got a list"),
    "rec missing measurements": (_drop(REC, "measurements"), "document", "missing field 'measurements'"),
    "rec measurements null": (_set(REC, "measurements", None), "measurements", "expected a list, got null"),
    "rec missing device": (_drop(REC, "device"), "document", "missing field 'device'"),
    "rec recorded a number": (_set(REC, "recorded", 20230506), "recorded", "expected a string, got 20230506"),
    "rec version as true": (_set(REC, "version", True), None,
                            "not a tiletune recording (format 'tiletune-recording', version True; "
                            "this tiletune reads format 'tiletune-recording' version 1)"),
    "rec huge integer in key": (_set(REC, "key", {"M": 10**400}), "key.M",
                                "integer out of range (it must fit in 64 bits), got 10000000000000000000...(401 characters)"),
    "rec no configs": (_set(REC, "measurements", []), None, "the recording has no configs to build a space from"),
    # any file
    "top level a list": ("[1, 2]", "document", "expected an object, got a list"),
    "top level a number": ("3", "document", "expected an object, got 3"),
    "unknown format": ('{"hello": 1}', None, "not a tiletune recording, a Kernel Tuner cache file or a T4 results file"),
    "export document": ('{"format": "tiletune-db", "version": 1, "sessions": []}', None,
                        "not a tiletune recording (format 'tiletune-db', version 1; "
                        "this tiletune reads format 'tiletune-recording' version 1)"),
    "lone surrogate": (_raw(KT, "kernel_name", '"vector\\ud800add"'), "kernel_name",
                       "expected Unicode text, got a lone surrogate \\ud800 (an unpaired escape)"),
    "non-UTF-8 bytes": (b'{"cache": "\xff\xfe"}', None, "not UTF-8 text: invalid start byte (byte 0xff at offset 11)"),
    "empty file": ("", None, "not valid JSON: Expecting value: line 1 column 1 (char 0)"),
}


def _content(value: str | bytes | dict[str, Any]) -> bytes:
    if isinstance(value, dict):
        return json.dumps(value).encode()
    return value.encode() if isinstance(value, str) else value


@pytest.mark.parametrize("case", list(RECORDING_CASES))
def test_hostile_recording_is_refused_and_nothing_is_written(tmp_path: pathlib.Path, case: str) -> None:
    content, field, problem = RECORDING_CASES[case]
    src = tmp_path / "src.json"
    src.write_bytes(_content(content))
    dest = tmp_path / "out.json.gz"
    expected = f"{src}: {field}: {problem}" if field else f"{src}: {problem}"

    with pytest.raises(InvalidRecording) as info:
        import_recording(src, dest)
    assert type(info.value) is InvalidRecording
    assert str(info.value) == expected
    assert (info.value.file, info.value.field, info.value.problem) == (str(src), field, problem)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.json"]  # no output, no temporary file

    # An existing destination is left byte for byte.
    dest.write_bytes(b"previous content")
    before = _digest(dest)
    with pytest.raises(InvalidRecording) as again:
        import_recording(src, dest)
    assert str(again.value) == expected
    assert _digest(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json.gz", "src.json"]


@pytest.mark.parametrize("case", ["kt times abc", "t4 runtimes -1", "rec samples abc", "deep nesting alone"])
def test_every_reader_refuses_the_same_way(tmp_path: pathlib.Path, case: str) -> None:
    """load_any, the format's own reader and Recording.load name the same field."""
    content, field, problem = RECORDING_CASES[case]
    src = tmp_path / "src.json"
    src.write_bytes(_content(content))
    expected = f"{src}: {field}: {problem}" if field else f"{src}: {problem}"
    readers: list[Callable[[], Any]] = [lambda: load_any(src)]
    if case.startswith("kt"):
        readers.append(lambda: Recording.from_kernel_tuner_cache(src))
    elif case.startswith("t4"):
        readers.append(lambda: Recording.from_t4(src))
    else:
        readers.append(lambda: Recording.load(src))
    for read in readers:
        with pytest.raises(InvalidRecording) as info:
            read()
        assert str(info.value) == expected


def test_truncated_json_is_refused(tmp_path: pathlib.Path) -> None:
    text = json.dumps(T4)[:150]
    src = tmp_path / "src.json"
    src.write_text(text)
    with pytest.raises(ValueError) as parse_error:
        json.loads(text)
    with pytest.raises(InvalidRecording) as info:
        import_recording(src, tmp_path / "out.json")
    assert str(info.value) == f"{src}: not valid JSON: {parse_error.value}"
    assert info.value.field is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.json"]


def test_over_size_files_are_refused_before_parsing(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_io, "MAX_FILE_BYTES", 200)
    src = tmp_path / "src.json"
    src.write_text(json.dumps(KT))
    size = src.stat().st_size
    with pytest.raises(InvalidRecording) as info:
        import_recording(src, tmp_path / "out.json")
    assert str(info.value) == f"{src}: too large: {size} bytes (the limit is 200 bytes)"
    # A small gzip file that decompresses past the limit (a "zip bomb") is refused too.
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * 100_000 + b"{}"))
    assert bomb.stat().st_size < 200
    with pytest.raises(InvalidRecording) as info:
        load_any(bomb)
    assert str(info.value) == f"{bomb}: too large once decompressed: more than 200 bytes (the limit is 200 bytes)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.json.gz", "src.json"]


def test_a_missing_source_names_it(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "nope.json"
    with pytest.raises(InvalidRecording) as info:
        import_recording(src, tmp_path / "out.json")
    assert str(info.value) == f"{src}: cannot read it: No such file or directory"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- valid hostile-looking input


def test_failed_configs_recorded_as_strings_are_valid(tmp_path: pathlib.Path) -> None:
    doc = _set(KT, "cache/64,1/time", "SomeFutureFailure")  # any string is a failure marker
    doc["cache"]["128,2"] = {"block_size_x": 128, "block_size_y": 2, "time": 1e20, "compile_time": 1.0}  # old caches
    doc["cache"]["32,2"] = {"block_size_x": 32, "block_size_y": 2, "time": 0.5, "times": []}  # empty: use time
    src = tmp_path / "kt.json"
    src.write_text(json.dumps(doc))
    dest = tmp_path / "kt.json.gz"
    rec = import_recording(src, dest, arch="sm_80")
    by = {tuple(m.config.values()): m for m in Recording.load(dest).measurements}
    assert by[(64, 2)].status is Status.COMPILE_ERROR and by[(64, 2)].reason == "CompilationFailedConfig"
    assert by[(128, 1)].status is Status.LAUNCH_ERROR and by[(128, 1)].reason == "RuntimeFailedConfig"
    assert by[(64, 1)].status is Status.LAUNCH_ERROR and by[(64, 1)].reason == "SomeFutureFailure"
    assert by[(128, 2)].status is Status.LAUNCH_ERROR and by[(128, 2)].reason == "recorded as failed (time 1e+20)"
    assert (64, 4) not in by and rec.space["invalid_configs"] == 1  # InvalidConfig: not part of the space
    assert by[(32, 2)].samples_us == (500.0,)
    assert by[(32, 1)].samples_us == (260.0, 250.0, 250.0, 240.0)
    assert Recording.load(dest).space_from_params().size() == 6


def test_failed_t4_results_are_not_checked(tmp_path: pathlib.Path) -> None:
    """A failed result's runtimes and measurements are not imported (here "x" and "error"): valid."""
    src = tmp_path / "t4.json"
    src.write_text(json.dumps(T4))
    rec = import_recording(src, tmp_path / "t4.rec.json", device="RTX", arch="sm_86")
    assert [m.status for m in rec.measurements] == [Status.OK, Status.OK, Status.COMPILE_ERROR]
    assert rec.measurements[1].samples_us == (9500.0,)


def test_open_kernel_tuner_cache_still_imports(tmp_path: pathlib.Path) -> None:
    text = json.dumps(KT, indent=0)
    body = text[: text.rindex('"128,1"')].rstrip()  # unterminated, trailing comma: as while tuning
    assert body.endswith(",")
    src = tmp_path / "open.json"
    src.write_text(body)
    assert len(load_any(src).measurements) == 3


# ---------------------------------------------------------------------- destinations


def _kt_source(tmp_path: pathlib.Path) -> pathlib.Path:
    src = tmp_path / "kt.json"
    src.write_text(json.dumps(KT))
    return src


def test_destination_equal_to_source_is_refused(tmp_path: pathlib.Path) -> None:
    src = _kt_source(tmp_path)
    before = _digest(src)
    with pytest.raises(OutputError) as info:
        import_recording(src, src)
    assert type(info.value) is OutputError
    assert str(info.value) == f"cannot write {src}: it is the input file {src} (choose another destination)"
    assert (info.value.path, info.value.problem) == (str(src), f"it is the input file {src} (choose another destination)")
    same = tmp_path / "." / "kt.json"  # another spelling of the same path
    with pytest.raises(OutputError):
        import_recording(src, same)
    assert _digest(src) == before and sorted(p.name for p in tmp_path.iterdir()) == ["kt.json"]


def test_destination_linked_to_source_is_refused(tmp_path: pathlib.Path) -> None:
    src = _kt_source(tmp_path)
    before = _digest(src)
    link = tmp_path / "link.json"
    link.symlink_to(src)
    hard = tmp_path / "hard.json"
    os.link(src, hard)
    for dest in (link, hard):
        with pytest.raises(OutputError) as info:
            import_recording(src, dest)
        assert str(info.value) == f"cannot write {dest}: it is the input file {src} (choose another destination)"
    with pytest.raises(OutputError) as info:  # the source given through the link
        import_recording(link, src)
    assert str(info.value) == f"cannot write {src}: it is the input file {link} (choose another destination)"
    assert _digest(src) == before and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.json", "kt.json", "link.json"]


def test_missing_output_folder_is_an_error_not_created(tmp_path: pathlib.Path) -> None:
    src = _kt_source(tmp_path)
    dest = tmp_path / "missing" / "deeper" / "out.json"
    with pytest.raises(OutputError) as info:
        import_recording(src, dest)
    assert str(info.value) == f"cannot write {dest}: the folder {dest.parent} does not exist"
    assert not (tmp_path / "missing").exists()
    with pytest.raises(OutputError) as info:  # save_recording too
        save_recording(dest, name="op", key=[], device=DeviceInfo("d", "sm_90", 1), versions={}, measurements=[])
    assert str(info.value) == f"cannot write {dest}: the folder {dest.parent} does not exist"
    assert not (tmp_path / "missing").exists()


def test_destination_that_is_a_folder_is_refused(tmp_path: pathlib.Path) -> None:
    src = _kt_source(tmp_path)
    folder = tmp_path / "dir"
    folder.mkdir()
    with pytest.raises(OutputError) as info:
        import_recording(src, folder)
    assert str(info.value) == f"cannot write {folder}: it is a folder"
    assert list(folder.iterdir()) == []


def test_a_failed_write_leaves_the_destination_and_no_temporary_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _kt_source(tmp_path)
    dest = tmp_path / "out.json"
    dest.write_text("old")
    before = _digest(dest)

    def broken_replace(a: Any, b: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OutputError) as info:
        import_recording(src, dest)
    assert str(info.value) == f"cannot write {dest}: No space left on device"
    assert _digest(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kt.json", "out.json"]


# ---------------------------------------------------------------------- dates and standard JSON out


def test_recording_import_keeps_the_recorded_dates(tmp_path: pathlib.Path) -> None:
    kt = _kt_source(tmp_path)
    out = import_recording(kt, tmp_path / "kt.rec.json")
    assert out.recorded == "2024-01-02 10:00:00+00:00"
    assert Recording.load(tmp_path / "kt.rec.json").recorded == "2024-01-02 10:00:00+00:00"

    t4 = tmp_path / "t4.json"
    t4.write_text(json.dumps(T4))
    import_recording(t4, tmp_path / "t4.rec.json.gz")
    assert Recording.load(tmp_path / "t4.rec.json.gz").recorded == "2023-12-21 10:44:42+00:00"

    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps(REC))
    import_recording(rec, tmp_path / "copy.json")
    copy_doc = json.loads((tmp_path / "copy.json").read_text())
    assert copy_doc["recorded"] == "2023-05-06T07:08:09Z"
    # Everything else survives the copy exactly too.
    assert {k: v for k, v in copy_doc.items() if k != "measurements"} == {k: v for k, v in REC.items() if k != "measurements"}
    assert copy_doc["measurements"] == REC["measurements"]

    no_dates = tmp_path / "nodates.json"
    no_dates.write_text(json.dumps({**KT, "cache": {k: {f: x for f, x in e.items() if f != "timestamp"}
                                                    for k, e in KT["cache"].items()}}))
    assert import_recording(no_dates, tmp_path / "nodates.rec.json").recorded == "unknown"


def test_written_recordings_are_standard_json(tmp_path: pathlib.Path) -> None:
    src = _kt_source(tmp_path)
    for name in ("a.json", "b.json.gz"):
        dest = tmp_path / name
        import_recording(src, dest)
        raw = dest.read_bytes()
        doc = _strict_loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
        assert doc["format"] == "tiletune-recording"


def test_save_recording_refuses_values_json_cannot_hold(tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "r.json"
    dest.write_text("old")
    before = _digest(dest)
    dev = DeviceInfo("d", "sm_90", 1)
    bad = [Measurement({"T": 1}, Status.OK, "", (1.0, float("nan")), 0.5)]
    with pytest.raises(OutputError) as info:
        save_recording(dest, name="op", key=[], device=dev, versions={}, measurements=bad)
    assert str(info.value) == f"cannot write {dest}: measurements[0].samples_us[1]: expected a finite positive number, got NaN"
    with pytest.raises(OutputError) as info:
        save_recording(dest, name="op", key={"x": float("inf")}, device=dev, versions={},
                       measurements=[Measurement({"T": 1}, Status.OK, "", (1.0,), 0.5)])
    assert str(info.value) == f"cannot write {dest}: key.x: standard JSON cannot represent NaN or Infinity"
    assert _digest(dest) == before and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_save_recording_writes_the_given_date_and_never_a_zero_sample(tmp_path: pathlib.Path) -> None:
    ms = [Measurement({"T": 1}, Status.OK, "", (0.0001, 2.0), 0.5)]  # rounds to 0.0 at 3 decimals
    p = save_recording(tmp_path / "r.json", name="op", key=[], device=DeviceInfo("d", "sm_90", 1), versions={},
                       measurements=ms, recorded="2020-01-01T00:00:00Z")
    rec = Recording.load(p)
    assert rec.recorded == "2020-01-01T00:00:00Z" and rec.measurements[0].samples_us == (0.0001, 2.0)


# ---------------------------------------------------------------------- db import


def _identity(kernel_id: str = "k0") -> TuningIdentity:
    return TuningIdentity(kernel_id, "space0", '{"M":64}', DeviceInfo("NVIDIA H200", "sm_90", 132),
                          '{"cuda_tile":"1.7.0"}', "matmul")


def _measurements() -> list[Measurement]:
    return [
        Measurement({"TM": 64, "swizzle": True}, Status.OK, "", (10.5, 10.25, 10.75), 1.25, 0, True),
        Measurement({"TM": 128, "swizzle": False}, Status.OK, "", (9.5, 9.75), 1.5, 1),
        Measurement({"TM": 256, "swizzle": False}, Status.COMPILE_ERROR, "too big", (), None, 2),
    ]


def _records(path: pathlib.Path) -> tuple[Any, ...]:
    db = TuningDB(path)
    try:
        return (db.winners(), db.measurements(), db.sessions(), db.stats()["sessions"])
    finally:
        db.close()


@pytest.fixture
def db_path(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "t.db"
    with TuningDB(path) as db:
        db.record_session(_identity("present"), _measurements(), {"TM": 128, "swizzle": False}, 9.625)
    return path


def _export_doc() -> dict[str, Any]:
    with TuningDB(":memory:") as db:
        db.record_session(_identity("k1"), _measurements(), {"TM": 128, "swizzle": False}, 9.625)
        db.record_session(_identity("k2"), _measurements(), None, None)
        buf = io.StringIO()
        db.export_json(buf)
    return json.loads(buf.getvalue())


GOOD = _export_doc()
M0 = "sessions/0/measurements/0"

#: case -> (content, field or None, problem); "import file <path>: " comes first.
DB_CASES: dict[str, tuple[str | bytes, str | None, str]] = {
    "huge float as text": (_raw(GOOD, "sessions/0/created", "1e400"),
                           "sessions[0].created", "number out of range, got 1e400"),
    "huge integer": (_raw(GOOD, "sessions/0/measurements/2/order", "1" + "0" * 400), "sessions[0].measurements[2].order",
                     "integer out of range (it must fit in 64 bits), got 10000000000000000000...(401 characters)"),
    "deep nesting": (_raw(GOOD, "sessions/1/tied", DEEP), None, "nested deeper than 64 levels"),
    "deep nesting alone": (DEEP, None, "nested deeper than 64 levels"),
    "samples abc": (_set(GOOD, f"{M0}/samples_us/1", "abc"), "sessions[0].measurements[0].samples_us[1]",
                    "expected a number, got str"),
    "samples null": (_set(GOOD, f"{M0}/samples_us/1", None), "sessions[0].measurements[0].samples_us[1]",
                     "expected a number, got NoneType"),
    "samples NaN": (_raw(GOOD, f"{M0}/samples_us/1", "NaN"), "sessions[0].measurements[0].samples_us[1]",
                    "expected a finite number, got NaN (NaN and Infinity are not standard JSON)"),
    "samples -Infinity": (_raw(GOOD, f"{M0}/samples_us/1", "-Infinity"), "sessions[0].measurements[0].samples_us[1]",
                          "expected a finite number, got -Infinity (NaN and Infinity are not standard JSON)"),
    "samples -1": (_set(GOOD, f"{M0}/samples_us/0", -1), "sessions[0].measurements[0].samples_us[0]",
                   "expected a finite positive number, got -1"),
    "samples 0": (_set(GOOD, f"{M0}/samples_us/0", 0.0), "sessions[0].measurements[0].samples_us[0]",
                  "expected a finite positive number, got 0.0"),
    "samples boolean": (_set(GOOD, f"{M0}/samples_us/0", True), "sessions[0].measurements[0].samples_us[0]",
                        "expected a number, got bool"),
    "samples not a list": (_set(GOOD, f"{M0}/samples_us", "10.5"), "sessions[0].measurements[0].samples_us",
                           "expected a list, got str"),
    "compile_s negative": (_set(GOOD, f"{M0}/compile_s", -0.5), "sessions[0].measurements[0].compile_s",
                           "expected a finite non-negative number, got -0.5"),
    "winner median Infinity": (_raw(GOOD, "sessions/0/winner_median_us", "Infinity"),
                               "sessions[0].winner_median_us",
                               "expected a finite number, got Infinity (NaN and Infinity are not standard JSON)"),
    "winner median 0": (_set(GOOD, "sessions/0/winner_median_us", 0), "sessions[0].winner_median_us",
                        "expected a finite positive number, got 0"),
    "created negative": (_set(GOOD, "sessions/1/created", -1), "sessions[1].created",
                         "expected a finite non-negative number, got -1"),
    "created as text": (_set(GOOD, "sessions/1/created", "yesterday"), "sessions[1].created",
                        "expected a number, got str"),
    "order negative": (_set(GOOD, f"{M0}/order", -1), "sessions[0].measurements[0].order",
                       "expected an integer >= 0, got -1"),
    "sm_count boolean": (_set(GOOD, "sessions/1/identity/device/sm_count", True),
                         "sessions[1].identity.device.sm_count", "expected an integer, got bool"),
    "config value a list": (_set(GOOD, f"{M0}/config/TM", [64]), "sessions[0].measurements[0].config.TM",
                            "expected a number, string, boolean or null, got list"),
    "winner value an object": (_set(GOOD, "sessions/0/winner/TM", {"v": 1}), "sessions[0].winner.TM",
                               "expected a number, string, boolean or null, got dict"),
    "top level a list": ("[]", "document", "expected an object, got list"),
    "missing sessions": (_drop(GOOD, "sessions"), "document", "missing field 'sessions'"),
    "missing samples": (_drop(GOOD, f"{M0}/samples_us"), "sessions[0].measurements[0]", "missing field 'samples_us'"),
    "kernel_id a number": (_set(GOOD, "sessions/1/identity/kernel_id", 5), "sessions[1].identity.kernel_id",
                           "expected a string, got int"),
    "lone surrogate": (_raw(GOOD, "sessions/1/session_id", '"s\\udfff"'), "sessions[1].session_id",
                       "expected Unicode text, got a lone surrogate \\udfff (an unpaired escape)"),
    "non-UTF-8 bytes": (b'{"format": "tiletune-db\xff"}', None,
                        "not UTF-8 text: invalid start byte (byte 0xff at offset 23)"),
    "empty file": ("", None, "not valid JSON: Expecting value: line 1 column 1 (char 0)"),
}


@pytest.mark.parametrize("case", list(DB_CASES))
def test_hostile_db_import_changes_nothing(db_path: pathlib.Path, tmp_path: pathlib.Path, case: str) -> None:
    content, field, problem = DB_CASES[case]
    bad = tmp_path / "bad.json"
    bad.write_bytes(_content(content))
    before = _records(db_path)
    expected = f"import file {bad}: {field}: {problem}" if field else f"import file {bad}: {problem}"
    with pytest.raises(InvalidImport) as info:
        TuningDB(db_path).import_json(bad)
    assert type(info.value) is InvalidImport and isinstance(info.value, DatabaseError)
    assert str(info.value) == expected
    assert (info.value.file, info.value.field, info.value.problem) == (str(bad), field, problem)
    assert _records(db_path) == before
    # The same through a stream.
    with pytest.raises(InvalidImport) as info:
        TuningDB(db_path).import_json(io.BytesIO(_content(content)))
    assert str(info.value) == expected.replace(str(bad), "<stream>")
    assert _records(db_path) == before


def test_db_import_of_a_partly_valid_file_inserts_nothing(db_path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The first sessions are fine, the last is not: one transaction, nothing is inserted."""
    doc = _set(GOOD, "sessions/1/measurements/2/samples_us", [1.0, -2.0])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    before = _records(db_path)
    with pytest.raises(InvalidImport) as info:
        TuningDB(db_path).import_json(bad)
    assert str(info.value) == (f"import file {bad}: sessions[1].measurements[2].samples_us[1]: "
                               "expected a finite positive number, got -2.0")
    assert _records(db_path) == before
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    assert TuningDB(db_path).import_json(good) == 2  # the control: the unmodified document imports


def test_db_import_over_size(db_path: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_io, "MAX_FILE_BYTES", 100)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(GOOD))
    size = big.stat().st_size
    before = _records(db_path)
    with pytest.raises(InvalidImport) as info:
        TuningDB(db_path).import_json(big)
    assert str(info.value) == f"import file {big}: too large: {size} bytes (the limit is 100 bytes)"
    with pytest.raises(InvalidImport) as info:
        TuningDB(db_path).import_json(io.StringIO(json.dumps(GOOD)))
    assert str(info.value) == "import file <stream>: too large: more than 100 bytes (the limit is 100 bytes)"
    assert _records(db_path) == before


def test_db_import_truncated(db_path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    text = json.dumps(GOOD)[:-40]
    with pytest.raises(ValueError) as parse_error:
        json.loads(text)
    bad = tmp_path / "cut.json"
    bad.write_text(text)
    before = _records(db_path)
    with pytest.raises(InvalidImport) as info:
        TuningDB(db_path).import_json(bad)
    assert str(info.value) == f"import file {bad}: not valid JSON: {parse_error.value}"
    assert _records(db_path) == before


# ---------------------------------------------------------------------- db export


def test_db_export_to_a_missing_folder(db_path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "missing" / "out.json"
    with pytest.raises(ExportError) as info:
        TuningDB(db_path).export_json(dest)
    assert isinstance(info.value, DatabaseError) and isinstance(info.value, OutputError)
    assert str(info.value) == f"cannot write export file {dest}: the folder {dest.parent} does not exist"
    assert not dest.parent.exists()


def test_db_export_onto_the_database_is_refused(db_path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    before = _records(db_path)
    link = tmp_path / "link.json"
    link.symlink_to(db_path)
    for dest in (db_path, link, pathlib.Path(str(db_path) + "-wal")):
        with pytest.raises(ExportError) as info:
            TuningDB(db_path).export_json(dest)
        assert str(info.value).startswith(f"cannot write export file {dest}: it is the database file ")
        assert str(info.value).endswith(" (choose another destination)")
    assert _records(db_path) == before


def test_db_export_refuses_stored_non_finite_numbers(tmp_path: pathlib.Path) -> None:
    """Only a direct record_session (never an import) can store a NaN; export refuses to write it."""
    path = tmp_path / "t.db"
    with TuningDB(path) as db:
        db.record_session(_identity(), [Measurement({"TM": 64}, Status.OK, "", (1.0, float("nan")), 0.5)],
                          {"TM": 64}, 1.0)
    dest = tmp_path / "out.json"
    dest.write_text("old")
    before = _digest(dest)
    with pytest.raises(ExportError) as info:
        TuningDB(path).export_json(dest)
    assert str(info.value) == (f"cannot write export file {dest}: sessions[0].measurements[0].samples_us[1]: the "
                               "database holds a NaN or Infinity, which standard JSON cannot represent")
    assert _digest(dest) == before and sorted(p.name for p in tmp_path.iterdir())[:2] == ["out.json", "t.db"]
    buf = io.StringIO()
    with pytest.raises(ExportError):
        TuningDB(path).export_json(buf)
    assert buf.getvalue() == ""


def test_export_import_round_trip_keeps_dates_and_values_exactly(db_path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with TuningDB(db_path) as db:
        db.record_session(_identity("second"), [Measurement({"TM": 32}, Status.OK, "", (0.1 + 0.2, 1e-7, 123456.789),
                                                            0.333333333333, 0)], {"TM": 32}, 0.30000000000000004)
    out = tmp_path / "export.json"
    assert TuningDB(db_path).export_json(out) == 2
    text = out.read_text()
    doc = _strict_loads(text)  # standard JSON
    other = tmp_path / "other.db"
    assert TuningDB(other).import_json(out) == 2
    src, dst = _records(db_path), _records(other)
    assert dst == src  # winners (created times included), measurements, session ids
    assert [w.created for w in dst[0]] == [s["created"] for s in doc["sessions"]]
    again = io.StringIO()
    TuningDB(other).export_json(again)
    doc2 = json.loads(again.getvalue())
    assert doc2["sessions"] == doc["sessions"]  # a second export is the same, dates included


def test_strict_parser_of_the_tests_refuses_nan() -> None:
    with pytest.raises(ValueError):
        _strict_loads("[NaN]")
    assert issubclass(InvalidRecording, TiletuneError) and issubclass(InvalidRecording, ValueError)
