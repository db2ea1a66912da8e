"""The shipped tuning tables still serve the library ops (CPU, no GPU).

A table entry answers a call only while the op's identity today (the kernel id hashed from the launch
plan's and the kernels' sources, the space hash, the bucketed key) equals the one it was made with
(:attr:`tiletune.resolve.problem.Problem.identity`, :func:`tiletune.resolve.tables.lookup`). Editing a library kernel, a
launch plan or a space therefore retires its shipped entries silently: the first call tunes for
seconds to a minute instead of being answered at once. This test catches that in CI.

For every entry of every table in ``tiletune/data/tables/`` it

1. rebuilds the call's arguments from the entry's key on *meta* tensors (shapes, dtypes, strides;
   the plans read nothing else) and, for an :class:`~tiletune.kernels.library_op.LibraryOp`, runs the
   op's own ``prepare_*`` function on them, which picks the regime (hence the space) as a real call
   does;
2. finds the library op of the entry's name whose current space has the entry's space hash (a
   module-level ``autotune`` op of ``tiletune.kernels``, or the family's op of that regime);
3. builds the op's identity with :attr:`tiletune.resolve.problem.Problem.identity` itself (same identity
   configs, plan, cuTile ``kernel_sources``), with the table's device and versions, and asks the
   table (:meth:`TuningTable.lookup`) and :meth:`tiletune.resolve.problem.OpSpec.config_from` whether the
   entry would serve that identity, exactly as :class:`tiletune.resolve.tables.TableSource` does on a GPU.

Only the SM count is faked (the grid is not part of the identity).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

import tiletune.kernels as K  # noqa: E402
from tiletune.resolve import tables  # noqa: E402
from tiletune.devices.backends.cutile import CutileBackend  # noqa: E402
from tiletune.devices.plans import PlanCache  # noqa: E402
from tiletune.op.tuned_op import TunedOp  # noqa: E402
from tiletune.kernels import _membound  # noqa: E402
from tiletune.kernels.library_op import LibraryOp  # noqa: E402
from tiletune.kernels import attention_op as aop  # noqa: E402
from tiletune.kernels import decode_attention_op as dop  # noqa: E402
from tiletune.kernels import gemm as gemm_mod  # noqa: E402
from tiletune.kernels.cross_entropy_op import prepare_cross_entropy  # noqa: E402
from tiletune.kernels.gemm_kernels import splitk_regime  # noqa: E402
from tiletune.kernels.glu import prepare_glu  # noqa: E402
from tiletune.kernels.norms import prepare_layer_norm, prepare_rms_norm, prepare_rms_norm_residual  # noqa: E402
from tiletune.kernels.rope import prepare_rope  # noqa: E402
from tiletune.kernels.softmax_op import prepare_softmax  # noqa: E402

FAKE_SM_COUNT = 132  # only the grid reads it, and the grid is not part of the identity

HOW_TO_FIX = (
    "A shipped tuning-table entry only answers while the op's kernel id (launch plan + kernel sources), "
    "space hash and key are unchanged; these no longer match, so their first calls now tune (seconds to a "
    "minute) instead of being served from the table.\n"
    "Fix: re-tune those calls on an H200 with benchmarks/make_table.py from a fresh --db; it merges into the "
    "table file and replaces the old entry of every call it tunes again (same op name and key):\n"
    "    python benchmarks/make_table.py --db /tmp/fill.db --table src/tiletune/data/tables/h200-sm90.json "
    "--tokens 1,16   # the token counts of the stale entries\n"
    "then commit the new table. If the change to the kernel is not worth a GPU run yet, list the entries in "
    "KNOWN_STALE in tests/test_shipped_table.py with the reason (they cost a tuning on first use)."
)

#: Entries known to be stale, as (name, kernel_id, key): each with the reason, until the table is
#: re-made on the GPU. Only these are tolerated; any other stale entry fails the test, and so does a
#: listed entry that is no longer in the table or is fresh again (keep the list true).
KNOWN_STALE: dict[tuple[str, str, str], str] = {}


# ------------------------------------------------------------------------------------ the matcher


@dataclasses.dataclass(frozen=True)
class Stale:
    """One entry that would not serve its call today, and why."""

    table: str
    entry: tables.TableEntry
    why: str

    def describe(self) -> str:
        return (f"{self.entry.name} kernel_id={self.entry.kernel_id} space_hash={self.entry.space_hash}\n"
                f"      key={self.entry.key}\n      {self.why}")


def _strides(d: dict[str, Any]) -> list[int]:
    """Strides of a tensor of a stored key (the inverse of :func:`tiletune.buckets._layout`)."""
    shape = [int(n) for n in d["shape"]]
    if d["contiguous"]:
        out, acc = [], 1
        for n in reversed(shape):
            out.append(acc)
            acc *= max(n, 1)
        return out[::-1]
    order, ratios = d["dim_order"], d["stride_ratios"]
    st: list[int | None] = [None] * len(shape)
    acc = 1
    for i in reversed(order):  # innermost first
        st[i] = int(round(ratios[i] * acc))
        acc *= shape[i]
    outer = max([st[i] * shape[i] for i in order] + [1])  # type: ignore[operator]
    return [outer if s is None else s for s in st]  # a size-1 dimension's stride is never read


def args_from_key(key: str) -> tuple[Any, ...]:
    """A call's plan arguments rebuilt from a stored (bucketed or default) key: tensors on the meta
    device with the key's shape, dtype and layout; ints, bools, strings and None as stored; a float
    (stored by type only) as 1e-6."""
    parts = json.loads(key)
    if parts and parts[0] == {"bucketed": True}:
        parts = parts[1:]
    if len(parts) == 1 and isinstance(parts[0], dict) and "problem" in parts[0]:
        return args_from_problem(parts[0])
    out: list[Any] = []
    for p in parts:
        if isinstance(p, dict) and "shape" in p:
            out.append(torch.empty_strided(p["shape"], _strides(p), dtype=getattr(torch, p["dtype"]), device="meta"))
        elif isinstance(p, dict) and p.get("type") == "float":
            out.append(1e-6)
        elif isinstance(p, dict):
            raise ValueError(f"cannot rebuild a key part {p!r}")
        else:
            out.append(p)
    return tuple(out)


def _meta(*shape: int, dtype: str = "bfloat16") -> Any:
    return torch.empty(shape, dtype=getattr(torch, dtype), device="meta")


def args_from_problem(p: dict[str, Any]) -> tuple[Any, ...]:
    """Plan arguments of a named problem key (:mod:`tiletune.kernels._keys`), contiguous meta tensors of the
    problem's (bucket-top) sizes."""
    kind = p["problem"]
    if kind == "gemm":
        b, m, n, k = p["batch"], p["M"], p["N"], p["K"]
        ta, tb = p["layout"][0] == "t", p["layout"][1] == "t"
        a = _meta(b, k, m, dtype=p["dtype"]) if ta else _meta(b, m, k, dtype=p["dtype"])
        w = _meta(b, n, k, dtype=p["dtype"]) if tb else _meta(b, k, n, dtype=p["dtype"])
        one = _meta(1, dtype="float32")
        return (a, w, _meta(b, m, n, dtype=p["out_dtype"]), one, one, ta, tb, p["scaled"])
    if kind == "rope":
        t, h = p["tokens"], p["rotary"] // 2
        q, k = _meta(1, t, p["q_heads"], 2 * h, dtype=p["dtype"]), _meta(1, t, p["kv_heads"], 2 * h, dtype=p["dtype"])
        c = _meta(1, t, 2 * h, dtype=p["trig_dtype"])
        return (q[..., :h], q[..., h:], k[..., :h], k[..., h:], c[..., :h], c[..., h:], c[..., :h], c[..., h:])
    if kind == "attention":
        bh, d = p["batch_heads"], p["head_dim"]
        q = _meta(1, bh, p["q_len"], d, dtype=p["dtype"])
        kv = _meta(1, bh // p["group"], p["kv_len"], d, dtype=p["dtype"])
        return (q, kv, kv, _meta(1, bh, p["q_len"], d, dtype=p["dtype"]), p["causal"], 1e-6)
    raise ValueError(f"cannot rebuild a problem {p!r}")


def _whole(view: Any, last: int) -> Any:
    """A meta tensor whose ``[..., :k]`` slices have ``view``'s strides, with last dimension ``last``."""
    return torch.empty_strided((*view.shape[:-1], last), view.stride(), dtype=view.dtype, device="meta")


def _glu(x_gate: Any, up: Any, y: Any, act: int) -> Any:
    m, h = x_gate.shape
    x = torch.empty_strided((m, 2 * h), (x_gate.stride(0) if m > 1 else 2 * h, 1), dtype=x_gate.dtype, device="meta")
    return prepare_glu(x, act)


def _rope(q1, q2, k1, k2, c1, c2, s1, s2) -> Any:
    return prepare_rope(_whole(q1, 2 * q1.shape[-1]), _whole(k1, 2 * k1.shape[-1]), _whole(c1, 2 * c1.shape[-1]),
                        _whole(s1, 2 * s1.shape[-1]), "bshd")


class _SplitK:  # GEMM_SPLITK has no prepare_*: its regime as tiletune.kernels.gemm.matmul computes it
    @staticmethod
    def prepare(a, b, c, sa, sb, trans_a, trans_b, scaled, ws=None, sem=None) -> Any:
        k = a.shape[1] if trans_a else a.shape[2]
        regime = splitk_regime(c.shape[1], c.shape[2], k, a.element_size(), c.shape[0])
        if ws is None:  # a named key: the scratch's shapes follow from the problem (they are not in the key)
            shape, nsem = gemm_mod.splitk_scratch_shapes(c.shape[1], c.shape[2], c.shape[0], regime[3])
            ws, sem = _meta(*shape, dtype="float32"), _meta(nsem, dtype="int32")
        return _membound.Prepared(gemm_mod.GEMM_SPLITK, regime, (a, b, c, sa, sb, trans_a, trans_b, scaled, ws, sem),
                                  None)


def _attention(q, k, v, o, causal, scale) -> Any:
    """Attention's call through the public function's argument checks (not the device check: meta
    tensors), in the regime of its head size."""
    names = ("q", "k", "v")
    aop.check_qkv_tensors("attention", names, q, k, v)
    aop.check_head_dim("attention", q, aop.ATTENTION_HEAD_DIMS)
    aop.check_kv_shapes("attention", names, q, k, v)
    return _membound.Prepared(aop.ATTENTION, aop.attention_regime(q.shape[-1]), (q, k, v, o, causal, scale), None)


def _one_regime(lib: LibraryOp) -> Callable[..., Any]:
    """The rule of a library op with one space (regime ``None``): the plan arguments are the call."""
    return lambda *args: _membound.Prepared(lib, None, args, None)


#: How a family's call is rebuilt from its plan arguments: the op's own ``prepare_*`` on the inputs the
#: plan arguments are views of (so the regime, hence the space, is the one a real call gets). A family
#: without a rule makes its entries fail with a message asking for one.
PREPARE: dict[str, Callable[..., Any]] = {
    "tiletune.rms_norm": lambda x, w, y, eps, has_w: prepare_rms_norm(x, w if has_w else None, eps),
    "tiletune.rms_norm_residual": lambda x, r, w, y, h, eps, has_w: prepare_rms_norm_residual(
        x, r, w if has_w else None, eps),
    "tiletune.layer_norm": lambda x, w, b, y, eps, has_w, has_b: prepare_layer_norm(
        x, w if has_w else None, b if has_b else None, eps),
    "tiletune.softmax": lambda x, y: prepare_softmax(x),
    "tiletune.swiglu": _glu,
    "tiletune.geglu": _glu,
    "tiletune.rope": _rope,
    "tiletune.cross_entropy": lambda logits, target, loss, ph, part, sem, ii: prepare_cross_entropy(
        logits, target, False, ii),
    "tiletune.cross_entropy_grad": lambda logits, target, loss, g, part, sem, ii: prepare_cross_entropy(
        logits, target, True, ii),
    "tiletune.gemm_splitk": _SplitK.prepare,
    "tiletune.gemm": _one_regime(gemm_mod.GEMM),
    "tiletune.gemm_tf32": _one_regime(gemm_mod.GEMM_TF32),
    "tiletune.gemm_fp8": _one_regime(gemm_mod.GEMM_FP8),
    "tiletune.attention": _attention,
    "tiletune.decode_attention": _one_regime(dop.DECODE_PARTIAL),
    "tiletune.decode_combine": _one_regime(dop.DECODE_COMBINE),
    "tiletune.decode_attention_direct": _one_regime(dop.DECODE_DIRECT),
}


def library_ops() -> tuple[list[TunedOp], list[LibraryOp]]:
    """Every module-level tuned op and every op family of ``tiletune.kernels`` (all modules imported)."""
    ops: list[TunedOp] = []
    for info in pkgutil.iter_modules(K.__path__):
        mod = importlib.import_module(f"{K.__name__}.{info.name}")
        ops += [v for v in vars(mod).values() if isinstance(v, TunedOp) and all(v is not o for o in ops)]
    return ops, list(LibraryOp.instances())


class _TableBackend:
    """The cuTile backend's kernel identity (:meth:`CutileBackend.kernel_sources`, the function itself)
    on the table's device and versions: no GPU is asked."""

    kernel_sources = CutileBackend.kernel_sources

    def __init__(self, table: tables.TuningTable) -> None:
        self.table = table

    def device_info(self, dev: int) -> Any:
        return self.table.device

    def versions(self) -> dict[str, str]:
        return dict(self.table.versions)


def _candidates(entry: tables.TableEntry, ops: list[TunedOp], families: list[LibraryOp]
                ) -> tuple[list[tuple[TunedOp, tuple[Any, ...]]], list[str]]:
    """``(op, plan arguments)`` of each library op named like the entry that would take its call, and
    notes on the ones that could not be built."""
    args = args_from_key(entry.key)
    out, notes = [], []
    for op in ops:
        if op.name == entry.name:
            out.append((op, args))
    for fam in families:
        if fam.name != entry.name:
            continue
        rule = PREPARE.get(fam.name)
        if rule is None:
            notes.append(f"op family {fam.name} has no rule in PREPARE (tests/test_shipped_table.py) to rebuild its "
                         "call from a key: add one")
            continue
        try:
            prep = rule(*args)
        except Exception as exc:  # noqa: BLE001 - reported, with the entry
            notes.append(f"rebuilding the {fam.name} call from the key failed: {type(exc).__name__}: {exc}")
            continue
        out.append((prep.family.op(prep.regime), tuple(prep.args)))
    return out, notes


def stale_entries(table: tables.TuningTable) -> list[Stale]:
    """The entries of ``table`` that would not answer their call with today's library ops (each with the
    reason); [] when every entry still serves. Needs the SM-count helpers patched (see the fixture)."""
    ops, families = library_ops()
    backend = _TableBackend(table)
    arch = table.device.arch
    out = []
    for entry in table.entries.values():
        why = _why_stale(entry, table, backend, arch, ops, families)
        if why is not None:
            out.append(Stale(table.source, entry, why))
    return out


def _why_stale(entry: tables.TableEntry, table: tables.TuningTable, backend: Any, arch: str, ops: list[TunedOp],
               families: list[LibraryOp]) -> str | None:
    try:
        cands, notes = _candidates(entry, ops, families)
    except Exception as exc:  # noqa: BLE001
        return f"cannot rebuild the call from the key: {type(exc).__name__}: {exc}"
    if not cands:
        return "; ".join(notes) or f"no library op is named {entry.name!r} any more"
    same_space = [(op, a) for op, a in cands if op.space.hash == entry.space_hash]
    if not same_space:
        return (f"no current space of {entry.name} for this call has the entry's space hash {entry.space_hash} "
                f"(today: {sorted({op.space.hash for op, _ in cands})}): the space changed"
                + ("; " + "; ".join(notes) if notes else ""))
    reasons = []
    for op, args in same_space:
        plans = PlanCache(lambda cfg, op=op, args=args: op.launch_spec(cfg, args))
        key = op.key_fn(*args) if op.key_fn is not None else None
        ident = op.problem(args, key, plans=plans, backend=backend, device=0, arch=arch).identity
        if ident.key != entry.key:
            reasons.append(f"the key of the rebuilt call is {ident.key} (the key format or the op's arguments "
                           "changed, or the key cannot be rebuilt)")
            continue
        if ident.kernel_id != entry.kernel_id:
            reasons.append(f"kernel_id today is {ident.kernel_id}: the launch plan {op.plan.__module__}."
                           f"{op.plan.__qualname__} or a kernel it launches changed")
            continue
        if table.mismatch(ident) is not None or table.lookup(ident) != entry:
            reasons.append("the table does not answer the identity")  # same fields: should not happen
            continue
        if op.spec().config_from(entry.config, arch) is None:
            reasons.append(f"the config {entry.config} is not a valid config of the space on {arch}")
            continue
        return None
    return "; ".join(reasons)


# ------------------------------------------------------------------------------------ the tests


@pytest.fixture
def fake_sms(monkeypatch):
    """Meta tensors have no device: the plans' SM count is the H200's (the grid is not in the identity)."""
    monkeypatch.setattr(_membound, "sm_count", lambda device_index: FAKE_SM_COUNT)
    monkeypatch.setattr(gemm_mod, "_sm_count", lambda device_index: FAKE_SM_COUNT)
    return FAKE_SM_COUNT


def shipped_tables() -> list[tables.TuningTable]:
    files = [p for p in sorted(tables.SHIPPED.iterdir()) if p.name.endswith((".json", ".json.gz"))]
    return [tables.TuningTable.load(p) for p in files]


def _mark(e: tables.TableEntry) -> tuple[str, str, str]:
    return (e.name, e.kernel_id, e.key)


def test_there_is_a_shipped_table():
    assert shipped_tables(), f"no tuning table in {tables.SHIPPED}"


@pytest.mark.parametrize("table", shipped_tables(), ids=lambda t: t.source.rsplit("/", 1)[-1])
def test_every_shipped_entry_still_serves_its_call(fake_sms, table):
    stale = stale_entries(table)
    new = [s for s in stale if _mark(s.entry) not in KNOWN_STALE]
    marks = {_mark(e) for e in table.entries.values()}
    stale_marks = {_mark(s.entry) for s in stale}
    assert not new, (f"{len(new)} of {len(table)} entries of the shipped tuning table {table.source} are stale:\n  "
                     + "\n  ".join(s.describe() for s in new) + "\n\n" + HOW_TO_FIX)
    listed_but_fine = [m for m in KNOWN_STALE if m in marks and m not in stale_marks]
    assert not listed_but_fine, f"KNOWN_STALE lists entries that serve again; remove them: {listed_but_fine}"


def test_known_stale_entries_are_in_a_shipped_table():
    marks = {_mark(e) for t in shipped_tables() for e in t.entries.values()}
    gone = [m for m in KNOWN_STALE if m not in marks]
    assert not gone, f"KNOWN_STALE lists entries no shipped table holds any more (re-made?); remove them: {gone}"


def test_the_matcher_reports_a_changed_entry(fake_sms):
    """The check can fail: copies of a good entry with another kernel id, space hash, key or config
    (and one of an op that does not exist) are each reported, with the reason."""
    table = shipped_tables()[0]
    fresh = {_mark(s.entry) for s in stale_entries(table)}
    # an entry of a library op: its call is rebuilt through the op's argument checks, so a key whose
    # tensors disagree in dtype is caught (refused by the checks, or rebuilt into another key)
    good = next(e for e in sorted(table.entries.values(), key=lambda e: (e.name, e.key))
                if _mark(e) not in fresh and e.name in PREPARE)
    key = json.loads(good.key)
    if "problem" in key[1]:  # a named key: a dtype the op's checks refuse (attention) or route elsewhere
        key[1]["dtype"] = "float32"
    else:
        key[1]["dtype"] = "float16" if key[1]["dtype"] != "float16" else "float32"
    bad = {
        "kernel_id": dataclasses.replace(good, kernel_id="0" * 24),
        "space_hash": dataclasses.replace(good, space_hash="0" * 32),
        "key": dataclasses.replace(good, key=json.dumps(key, separators=(",", ":"), sort_keys=True)),
        "name": dataclasses.replace(good, name="tiletune.no_such_op"),
    }
    mutated = tables.TuningTable(table.device, table.versions, [good, *bad.values()], source="mutated")
    got = {(s.entry.name, s.entry.kernel_id, s.entry.space_hash, s.entry.key, json.dumps(s.entry.config)): s.why
           for s in stale_entries(mutated)}
    why = {what: got.pop((e.name, e.kernel_id, e.space_hash, e.key, json.dumps(e.config)), None)
           for what, e in bad.items()}
    assert not got, f"a good entry was reported: {got}"  # only the mutated copies
    assert "kernel_id today is " + good.kernel_id in why["kernel_id"]
    assert "space hash" in why["space_hash"]
    assert why["key"] is not None and any(
        t in why["key"] for t in ("the key of the rebuilt call", "kernel_id today", "call from the key failed")), why["key"]
    # a config the space does not hold (same identity as the good entry, so a table of its own)
    for config in ({**good.config, "occupancy": 1000}, {**good.config, "NO_SUCH_PARAMETER": 1}):
        odd = dataclasses.replace(good, config=config)
        got_cfg = stale_entries(tables.TuningTable(table.device, table.versions, [odd], source="odd config"))
        assert [s.entry for s in got_cfg] == [odd] and "not a valid config" in got_cfg[0].why
    assert "no library op is named" in why["name"]


def test_a_kernel_edit_is_reported(fake_sms, monkeypatch):
    """An edited kernel source (as cuTile's ``kernel_sources`` would read it) retires the entries of
    every op that launches it, and the report says so."""
    table = shipped_tables()[0]
    before = {_mark(s.entry) for s in stale_entries(table)}
    real = CutileBackend.kernel_sources
    edited = lambda k: getattr(k, "_pyfunc", k).__name__.startswith("softmax")  # noqa: E731
    monkeypatch.setattr(_TableBackend, "kernel_sources", lambda self, k: real(self, k) + "\n# edited" * edited(k))
    after = {_mark(s.entry): s for s in stale_entries(table)}
    softmax = {_mark(e) for e in table.entries.values() if e.name == "tiletune.softmax"}
    assert softmax and softmax <= set(after) - before
    assert all("kernel_id today is" in after[m].why for m in softmax)
    assert set(after) - before == softmax  # nothing else launches the softmax kernel


@pytest.mark.parametrize("rows,near", [(1058, [1024, 2048]), (1400, [1024, 2048]), (1500, [2048, 1024]),
                                       (600, [512, 1024]), (2048, None)])
def test_off_its_bound_the_shipped_gemm_entry_races_with_the_entries_nearest_the_rows(fake_sms, rows, near):
    """The library GEMM's real keys: ``x @ w.t()`` of 4,096 x 4,096 at ``rows`` rows keys as its power-of-two
    bucket. Off the bound the shipped table leaves the call to the race (:func:`tables.left_to_the_race`),
    whose neighbours, measured from the call's own rows, are the two entries around it: the call's exact key
    form lines up with the stored keys' (the same family). At the bound the table answers."""
    from tiletune.resolve.nearest import neighbours

    (table,) = [t for t in shipped_tables() if t.source.endswith("h200-sm90.json")]
    op, plan_args = gemm_mod.GEMM.op(None), args_from_problem(
        {"problem": "gemm", "batch": 1, "M": rows, "N": 4096, "K": 4096, "layout": "nt", "dtype": "bfloat16",
         "out_dtype": "bfloat16", "scaled": False})
    plans = PlanCache(lambda cfg: op.launch_spec(cfg, plan_args))
    problem = op.problem(plan_args, op.key_fn(*plan_args) if op.key_fn is not None else None, plans=plans,
                         backend=_TableBackend(table), device=0, arch=table.device.arch)
    assert problem.policy == "nearest"
    entry = table.lookup(problem.identity)
    assert entry is not None and f'"M":{1 << (rows - 1).bit_length()}' in entry.key
    assert tables.left_to_the_race(problem, table) is (near is not None)
    if near is None:
        return
    ident = problem.identity
    stored = [(e.key, e.config, e.median_us, table.source) for e in table.entries.values()
              if (e.kernel_id, e.space_hash) == (ident.kernel_id, ident.space_hash)]
    got = neighbours(ident.key, stored, problem.sizes_json)
    assert [json.loads(n.key)[1]["M"] for n in got[:2]] == near
    assert all('"N":4096' in n.key and '"K":4096' in n.key for n in got[:2])
