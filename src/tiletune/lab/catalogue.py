"""The template catalogue: one search-space template per kind of kernel users write, per architecture.

Each :class:`Template` turns a few facts about a problem (row length, element size, head dim) into a
:class:`~tiletune.Space` whose value lists come from :func:`~tiletune.per_arch` for ``sm_80``,
``sm_89``, ``sm_90``, ``sm_100`` and ``sm_120`` (any other architecture gets the ``sm_90`` values).
The ``sm_90`` values are the ones the library's own ops tune over (:mod:`tiletune.space.templates`, shrunk
from H200 recordings, see ``docs/TEMPLATES.md``); the other architectures' values are **unmeasured
starting points** derived from what each architecture lacks or adds (no TMA on ``sm_80``/``sm_89``,
about 100 KB of shared memory per SM on ``sm_89``/``sm_120``, CTA pairs on ``sm_100``). Tune with
them, then shrink with your own measurements.

=================  ==============  ==========================================================
template           kind            kernels
=================  ==============  ==========================================================
``elementwise``    memory-bound    elementwise / occupancy-only streams (activations, GLU)
``rowwise``        balanced        row reductions and norms (RMSNorm, LayerNorm, softmax)
``cross_entropy``  balanced        chunked cross-entropy over a vocabulary (loss or grad)
``rope``           memory-bound    rotary position embedding, in place
``matmul``         compute-bound   tensor-core GEMM (``ct.mma``)
``fmha``           compute-bound   fused attention forward (two ``ct.mma`` + online softmax)
``dual_gemm``      compute-bound   fused dual GEMM for GLU MLPs: ``act(x @ Wg) * (x @ Wu)``
``grouped_gemm``   compute-bound   persistent grouped GEMM (MoE experts, ragged groups)
=================  ==============  ==========================================================

Every template's space can be printed as Python code (:meth:`Template.code`): ``tiletune suggest``
does so for a kernel it classifies (:mod:`tiletune.lab.suggest`). The constraints of a printed space are
the named rules of this module and of :mod:`tiletune.space.templates`, imported by the code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tiletune.space.spaces import Config, PerArch, Space, per_arch
from tiletune.space.templates import (
    acc_fits,
    cross_entropy_loss_triples,
    cross_entropy_space,
    elementwise_space,
    fits_registers,
    matmul_baseline,
    matmul_params,
    matmul_shape,
    rope_space,
    row_regime,
    rowwise_space,
    stage_fits,
    warps_fit,
)

__all__ = [
    "ARCHS",
    "MEASURED_ARCHS",
    "KINDS",
    "Recipe",
    "Rule",
    "TEMPLATES",
    "Template",
    "attention_registers_fit",
    "chunk_fits",
    "dual_acc_fits",
    "dual_stage_fits",
    "dual_warps_fit",
    "in_flight_fits",
    "one_of",
    "score_tile_fits",
    "score_tile_in_flight",
    "template",
]

#: The architectures every template gives values for (others resolve to the ``sm_90`` values).
ARCHS: tuple[str, ...] = ("sm_80", "sm_89", "sm_90", "sm_100", "sm_120")

#: Architectures whose values come from measurements (the H200 recordings and sweeps).
MEASURED_ARCHS: tuple[str, ...] = ("sm_90",)

#: Kernel kinds, by what bounds them.
KINDS: tuple[str, ...] = ("memory-bound", "balanced", "compute-bound")

_NO_TMA = ("sm_80", "sm_89")  # no TMA: the latency hint and TMA stores change nothing
_SMALL_SMEM = ("sm_89", "sm_120")  # about 100 KB of shared memory per SM (sm_90 / sm_100: 228 KB)


# --------------------------------------------------------------------------------------------
# printable constraint rules
# --------------------------------------------------------------------------------------------


def in_flight_fits(lo_thread: int, hi_thread: int, lo_sm: int, hi_sm: int) -> Callable[[Any], bool]:
    """Constraint: ``TILE // (32 * num_worker_warps)`` values per thread in ``[lo_thread, hi_thread]`` and
    ``TILE * occupancy`` values per SM in ``[lo_sm, hi_sm]`` (the bytes-in-flight window of a stream)."""

    def in_flight(c: Any) -> bool:
        per_thread = c.TILE // (32 * c.num_worker_warps)
        return lo_thread <= per_thread <= hi_thread and lo_sm <= c.TILE * c.occupancy <= hi_sm

    return in_flight


def chunk_fits(streams: int = 1, values_per_sm: int = 16384) -> Callable[[Any], bool]:
    """Constraint: ``CHUNK * occupancy * streams <= values_per_sm`` (the fp32 chunks of the blocks
    sharing an SM stay in registers; :func:`tiletune.space.templates.fits_registers`)."""

    def regs_fit(c: Any) -> bool:
        return fits_registers(c.CHUNK, c.occupancy, streams, values_per_sm)

    return regs_fit


def one_of(names: Sequence[str], allowed: Sequence[Sequence[Any]]) -> Callable[[Any], bool]:
    """Constraint: the values of ``names`` form one of the ``allowed`` combinations (an allow-list)."""
    names = tuple(names)
    allowed_set = {tuple(a) for a in allowed}

    def allowed_combo(c: Any) -> bool:
        return tuple(c[n] for n in names) in allowed_set

    return allowed_combo


def score_tile_fits(c: Any) -> bool:
    """The fp32 attention score tile ``BLOCK_M x BLOCK_N`` has at most ``128 * 256`` elements."""
    return c.BLOCK_M * c.BLOCK_N <= 128 * 256


def score_tile_in_flight(elements: int) -> Callable[[Any], bool]:
    """Constraint: occupancy above 1 only for score tiles of at most ``elements`` elements."""

    def in_flight(c: Any) -> bool:
        return c.occupancy == 1 or c.BLOCK_M * c.BLOCK_N <= elements

    return in_flight


def attention_registers_fit(head_dim: int, per_thread: int = 192) -> Callable[[Any], bool]:
    """Constraint: the fp32 accumulator (``BLOCK_M x head_dim``) and score tile (``BLOCK_M x BLOCK_N``) come to
    at most ``per_thread`` elements per worker thread (more spills on sm_90)."""

    def consumer_registers(c: Any) -> bool:
        return c.BLOCK_M * (head_dim + c.BLOCK_N) <= per_thread * 32 * c.num_worker_warps

    return consumer_registers


def dual_stage_fits(elem_bytes: int) -> Callable[[Any], bool]:
    """Constraint: one pipeline stage of a dual GEMM (an ``A`` tile and two ``B`` tiles) is at most 48 KiB."""

    def fits(c: Any) -> bool:
        return (c.TM + 2 * c.TN) * c.TK * elem_bytes <= 49152

    return fits


def dual_acc_fits(c: Any) -> bool:
    """``2 * TM * TN * occupancy <= 256 * 128``: both fp32 accumulators of the co-resident blocks fit
    the register file."""
    return 2 * c.TM * c.TN * c.occupancy <= 256 * 128


def dual_warps_fit(c: Any) -> bool:
    """Two accumulators of ``256 * 128`` values in all need two consumer warpgroups (8 worker warps)."""
    return 2 * c.TM * c.TN < 256 * 128 or c.num_worker_warps == 8


@dataclass(frozen=True)
class Rule:
    """A named constraint together with the Python expression that builds it (for printed spaces)."""

    name: str
    fn: Callable[[Any], Any]
    expr: str
    module: str
    symbol: str

    @classmethod
    def of(cls, name: str, target: Callable[..., Any], *args: Any) -> "Rule":
        """``target`` itself (no ``args``: a predicate) or ``target(*args)`` (a rule factory)."""
        symbol = target.__name__
        fn = target(*args) if args else target
        expr = f"{symbol}({', '.join(_py(a) for a in args)})" if args else symbol
        return cls(name, fn, expr, target.__module__, symbol)


# --------------------------------------------------------------------------------------------
# recipes: the data of one template instance, as a Space or as code
# --------------------------------------------------------------------------------------------


def _py(value: Any) -> str:
    """Python source of a value made of scalars, lists, tuples and dicts."""
    if isinstance(value, PerArch):
        parts = [f"{a}={_py(v)}" for a, v in value.by_arch.items()]
        if value.has_default:
            parts.append(f"default={_py(value.default)}")
        return f"tt.per_arch({', '.join(parts)})"
    if isinstance(value, Mapping):
        if all(isinstance(k, str) and k.isidentifier() for k in value):
            return "dict(" + ", ".join(f"{k}={_py(v)}" for k, v in value.items()) + ")"
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(_py(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def _entry(name: str, value: Any, indent: str = "    ") -> list[str]:
    """``name=value,`` as lines of code: one line when short, else a ``per_arch`` entry per line."""
    line = f"{indent}{name}={_py(value)},"
    if len(line) <= 100 or not isinstance(value, PerArch):
        return [line]
    items = [*value.by_arch.items()] + ([("default", value.default)] if value.has_default else [])
    return [f"{indent}{name}=tt.per_arch(", *(f"{indent}    {a}={_py(v)}," for a, v in items), f"{indent}),"]


def _by_arch(values: Mapping[str, Any]) -> Any:
    """A plain value when every architecture has the same one, else a :class:`PerArch` whose default is
    the ``sm_90`` value."""
    first = values["sm_90"]
    if all(v == first for v in values.values()):
        return first
    return per_arch(default=first, **{a: values[a] for a in ARCHS})


@dataclass(frozen=True)
class Recipe:
    """One instance of a template: per-architecture parameter values, rules and baselines.

    ``values[arch][name]`` lists the values of parameter ``name`` on ``arch`` (one entry per
    :data:`ARCHS`), ``baselines[arch]`` the hand-picked config measured first there.
    """

    template: str
    call: str
    values: Mapping[str, Mapping[str, list[Any]]]
    baselines: Mapping[str, Mapping[str, Any]]
    rules: tuple[Rule, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Parameter names, in definition order."""
        return tuple(self.values["sm_90"])

    def params(self) -> dict[str, Any]:
        """``name -> list`` or ``name -> per_arch(...)`` as passed to :class:`~tiletune.Space`."""
        return {n: _by_arch({a: self.values[a][n] for a in ARCHS}) for n in self.names}

    def baseline(self) -> Any:
        """The baseline argument: one dict, or a ``per_arch`` of dicts."""
        return _by_arch({a: dict(self.baselines[a]) for a in ARCHS})

    def space(self) -> Space:
        """The template's :class:`~tiletune.Space`."""
        return Space(**self.params(), constraints={r.name: r.fn for r in self.rules}, baseline=self.baseline())

    def code(self, var: str = "space") -> str:
        """Python source that builds the same space (same :attr:`~tiletune.Space.hash`)."""
        lines = ["import tiletune as tt"]
        by_module: dict[str, list[str]] = {}
        for r in self.rules:
            if r.symbol not in by_module.setdefault(r.module, []):
                by_module[r.module].append(r.symbol)
        for mod, symbols in sorted(by_module.items()):
            lines.append(f"from {mod} import {', '.join(sorted(symbols))}")
        lines += ["", f"{var} = tt.Space("]
        for n, v in self.params().items():
            lines += _entry(n, v)
        if self.rules:
            lines.append("    constraints={")
            for r in self.rules:
                lines.append(f"        {r.name!r}: {r.expr},")
            lines.append("    },")
        lines += _entry("baseline", self.baseline())
        lines.append(")")
        return "\n".join(lines) + "\n"


def _same(values: Mapping[str, list[Any]]) -> dict[str, dict[str, list[Any]]]:
    """The same values on every architecture (to be edited per architecture)."""
    return {a: {n: list(v) for n, v in values.items()} for a in ARCHS}


def _sm90_of(space: Space) -> dict[str, list[Any]]:
    return {n: list(space.values(n, "sm_90")) for n in space.names}


def _first_valid(values: Mapping[str, list[Any]], rules: Sequence[Rule], prefer: Mapping[str, Any]) -> dict[str, Any]:
    """``prefer`` where its values are allowed and the rules hold, else the first valid config."""
    import itertools

    names = list(values)
    candidates = [dict(prefer)] if all(prefer.get(n) in values[n] for n in names) else []
    candidates += [dict(zip(names, t)) for t in itertools.product(*(values[n] for n in names))]
    for cand in candidates:
        cfg = Config(cand)
        if all(r.fn(cfg) for r in rules):
            return cand
    raise ValueError(f"no valid configuration among {dict(values)!r}")


def _finish(name: str, call: str, values: dict[str, dict[str, list[Any]]], rules: Sequence[Rule],
            prefer: Mapping[str, Mapping[str, Any]]) -> Recipe:
    baselines = {a: _first_valid(values[a], rules, prefer.get(a, prefer["sm_90"])) for a in ARCHS}
    return Recipe(name, call, values, baselines, tuple(rules))


# --------------------------------------------------------------------------------------------
# the templates
# --------------------------------------------------------------------------------------------


def _elementwise() -> Recipe:
    lib = elementwise_space()
    values = _same(_sm90_of(lib))
    for a in ("sm_80", "sm_89", "sm_120"):  # less bandwidth than HBM3e: fewer bytes in flight suffice
        values[a]["occupancy"] = [2, 4, 8]
    values["sm_100"]["TILE"] = [2048, 4096, 8192]  # more bandwidth: no 1024-element tiles
    rules = [Rule.of("in_flight", in_flight_fits, 8, 32, 8192, 65536)]
    base = lib.baseline("sm_90").as_dict()
    prefer = {"sm_90": base, **{a: {**base, "occupancy": 4} for a in ("sm_80", "sm_89", "sm_120")}}
    return _finish("elementwise", "elementwise()", values, rules, prefer)


def _chunked(call: str, *, streams: int, chunks: Sequence[int], lat: Sequence[int], store_tma: Sequence[bool],
             occupancies: Sequence[int], values_per_sm: int, worker_warps: Sequence[int] = (),
             name: str = "rowwise") -> Recipe:
    pairs = [(c, o) for c in chunks for o in occupancies if fits_registers(c, o, streams, values_per_sm)]
    sm90: dict[str, list[Any]] = dict(TM=[1], CHUNK=list(chunks), occupancy=sorted({o for _, o in pairs}),
                                      LAT=list(lat), STORE_TMA=list(store_tma), GRID_FRAC=[1.0])
    if worker_warps:
        sm90["num_worker_warps"] = list(worker_warps)
    rules = [Rule.of("regs_fit", chunk_fits, streams, values_per_sm)]
    first = pairs[0]
    base = dict(TM=1, CHUNK=first[0], occupancy=first[1], LAT=lat[0], STORE_TMA=store_tma[0], GRID_FRAC=1.0)
    if worker_warps:
        base["num_worker_warps"] = worker_warps[0]
    values, prefer = _chunked_per_arch(sm90, base)
    return _finish(name, call, values, rules, prefer)


def _chunked_per_arch(sm90: Mapping[str, list[Any]], base: Mapping[str, Any]) -> tuple[
        dict[str, dict[str, list[Any]]], dict[str, dict[str, Any]]]:
    """``(values, prefer)`` of a chunked-row kernel from its sm_90 values and preferred config: plain loads
    (no latency hint, stores straight from registers) where there is no TMA, and no 16384-column chunks and
    occupancy <= 2 with ~100 KB of shared memory."""
    values = _same(sm90)
    for a in _NO_TMA:
        values[a]["LAT"] = [0]
        values[a]["STORE_TMA"] = [True]
    for a in _SMALL_SMEM:
        chunks, occ = values[a]["CHUNK"], values[a]["occupancy"]
        values[a]["CHUNK"] = [c for c in chunks if c <= 8192] or [min(chunks)]
        values[a]["occupancy"] = [o for o in occ if o <= 2] or [min(occ)]
    prefer = {"sm_90": dict(base), **{a: {**base, "LAT": 0, "STORE_TMA": True} for a in _NO_TMA}}
    return values, prefer


def _rowwise(n_cols: int = 4096, dtype_bytes: int = 2, streams: int = 1, tma: bool = True) -> Recipe:
    call = f"rowwise(n_cols={n_cols}, dtype_bytes={dtype_bytes}, streams={streams}, tma={tma})"
    lib = rowwise_space(n_cols, dtype_bytes, streams=streams, tma=tma)
    if row_regime(n_cols, streams) == "chunked":  # the library's long-row settings, per architecture
        if "LAT" in lib.names and len(lib.values("LAT", "sm_90")) > 1:
            return _chunked(call, streams=streams, chunks=(4096, 8192), lat=(0, 10), store_tma=(False,),
                            occupancies=(1, 2, 4), values_per_sm=16384)
        return _chunked(call, streams=streams, chunks=(2048, 4096), lat=(0,), store_tma=(False,),
                        occupancies=(1, 2), values_per_sm=16384)
    values = _same(_sm90_of(lib))
    for a in _NO_TMA:
        values[a]["occupancy"] = list(lib.values("occupancy", "sm_80"))  # the library's Ampere occupancies
        values[a]["LAT"] = [0]
        values[a]["STORE_TMA"] = [True]
    occ = values["sm_90"]["occupancy"]
    values["sm_120"]["occupancy"] = [o for o in occ if o <= 2] or occ[:1]  # ~100 KB shared memory per SM
    base = lib.baseline("sm_90").as_dict()
    prefer: dict[str, dict[str, Any]] = {a: dict(base) for a in ARCHS}  # the library's pick where it is allowed
    for a in _NO_TMA:
        prefer[a].update(LAT=0, STORE_TMA=True)
    rules = []
    if row_regime(n_cols, streams) == "rows":  # short rows: the library's (rows per tile, occupancy) pairs
        pairs = sorted({(c.TM, c.occupancy) for c in lib.configs("sm_90")})
        rules.append(Rule.of("rows_in_flight", one_of, ("TM", "occupancy"), [list(p) for p in pairs]))
    return _finish("rowwise", call, values, rules, prefer)


def _cross_entropy(pass_: str = "loss") -> Recipe:
    """The library's one-launch cross-entropy spaces (:func:`~tiletune.space.templates.cross_entropy_space`):
    plain loads, so the same values on every architecture except no latency hint and plain stores where
    there is no TMA, and chunks of at most 8192 columns at occupancy <= 2 with ~100 KB of shared memory."""
    call = f"cross_entropy(pass_={pass_!r})"
    if pass_ not in ("loss", "grad"):
        raise ValueError(f"cross_entropy template: pass_ must be 'loss' or 'grad', got {pass_!r}")
    lib = cross_entropy_space(pass_)
    rules = []
    if pass_ == "loss":  # the (CHUNK, occupancy, PREFETCH) triples the H200 probe kept
        rules.append(Rule.of("chunk_triples", one_of, ("CHUNK", "occupancy", "PREFETCH"),
                             [list(t) for t in sorted(cross_entropy_loss_triples())]))
    values, prefer = _chunked_per_arch(_sm90_of(lib), lib.baseline("sm_90").as_dict())
    return _finish("cross_entropy", call, values, rules, prefer)


def _rope(heads_elems: int = 2048) -> Recipe:
    lib = rope_space(heads_elems)
    combos = [[c.TS, c.occupancy, c.num_worker_warps] for c in lib.configs("sm_90")]
    values = _same(_sm90_of(lib))
    for a in ("sm_80", "sm_89", "sm_120"):
        capped = [o for o in values["sm_90"]["occupancy"] if o <= 2]
        values[a]["occupancy"] = capped or values["sm_90"]["occupancy"][:1]
    rules = [Rule.of("in_flight", one_of, ("TS", "occupancy", "num_worker_warps"), combos)]
    return _finish("rope", f"rope(heads_elems={heads_elems})", values, rules,
                   {"sm_90": lib.baseline("sm_90").as_dict()})


def _gemm_values(elem_bytes: int, tm: Sequence[int] = (64, 128, 256)) -> dict[str, dict[str, list[Any]]]:
    sm90: dict[str, list[Any]] = dict(matmul_params(elem_bytes))
    sm90["TM"] = [t for t in sm90["TM"] if t in tm]
    sm90["num_ctas"] = [1]
    values = _same(sm90)
    k_bytes = [64 // elem_bytes, 128 // elem_bytes]
    values["sm_80"]["TK"] = k_bytes  # 164 KB of shared memory: shallower stages, more of them
    for a in _SMALL_SMEM:  # ~100 KB of shared memory: tiles up to 128 x 128, stages <= 32 KiB
        values[a]["TM"] = [t for t in values[a]["TM"] if t <= 128]
        values[a]["TN"] = [t for t in values[a]["TN"] if t <= 128]
        values[a]["TK"] = k_bytes
    values["sm_100"]["num_ctas"] = [1, 2]  # CTA pairs share the MMA (2-SM tcgen05)
    return values


def _gemm_rules(elem_bytes: int) -> list[Rule]:
    return [Rule.of("stage_fits", stage_fits, elem_bytes), Rule.of("acc_fits", acc_fits),
            Rule.of("warps_fit", warps_fit), Rule.of("library_shape", matmul_shape, elem_bytes)]


def _check_width(what: str, elem_bytes: int) -> None:
    if elem_bytes not in (1, 2, 4):
        raise ValueError(f"{what} template: elem_bytes must be 1, 2 or 4, got {elem_bytes!r}")


def _matmul(elem_bytes: int = 2) -> Recipe:
    _check_width("matmul", elem_bytes)
    values = _gemm_values(elem_bytes)
    base = {**matmul_baseline(elem_bytes), "num_ctas": 1}
    small = {**base, "TN": 128, "TK": 64 // elem_bytes, "num_worker_warps": 4}
    prefer = {"sm_90": base, "sm_80": {**base, "TK": 64 // elem_bytes}, "sm_89": small, "sm_120": small}
    return _finish("matmul", f"matmul(elem_bytes={elem_bytes})", values, _gemm_rules(elem_bytes), prefer)


def _grouped_gemm(elem_bytes: int = 2) -> Recipe:
    _check_width("grouped_gemm", elem_bytes)
    values = _gemm_values(elem_bytes, tm=(64, 128))  # groups are short: no 256-row tiles
    base = dict(TM=128, TN=128, TK=128 // elem_bytes, GROUP_M=8, LAT=0, occupancy=1, num_worker_warps=4,
                num_ctas=1)
    prefer = {"sm_90": base, **{a: {**base, "TK": 64 // elem_bytes} for a in ("sm_80", *_SMALL_SMEM)}}
    return _finish("grouped_gemm", f"grouped_gemm(elem_bytes={elem_bytes})", values, _gemm_rules(elem_bytes),
                   prefer)


def _dual_gemm(elem_bytes: int = 2) -> Recipe:
    _check_width("dual_gemm", elem_bytes)
    k = [64 // elem_bytes, 128 // elem_bytes, 256 // elem_bytes]
    sm90 = dict(TM=[64, 128, 256], TN=[64, 128], TK=k, GROUP_M=[8], LAT=[0], occupancy=[1, 2],
                num_worker_warps=[4, 8])
    values = _same(sm90)
    for a in ("sm_80", *_SMALL_SMEM):
        values[a]["TK"] = k[:2]
    for a in _SMALL_SMEM:
        values[a]["TM"] = [64, 128]
    rules = [Rule.of("stage_fits", dual_stage_fits, elem_bytes), Rule.of("acc_fits", dual_acc_fits),
             Rule.of("warps_fit", dual_warps_fit)]
    base = dict(TM=128, TN=128, TK=128 // elem_bytes, GROUP_M=8, LAT=0, occupancy=1, num_worker_warps=8)
    prefer = {"sm_90": base, **{a: {**base, "TN": 64, "num_worker_warps": 4} for a in _SMALL_SMEM}}
    return _finish("dual_gemm", f"dual_gemm(elem_bytes={elem_bytes})", values, rules, prefer)


def _fmha(head_dim: int = 128) -> Recipe:
    if head_dim not in (64, 128, 256):
        raise ValueError(f"fmha template: head_dim must be 64, 128 or 256, got {head_dim!r}")
    sm90 = dict(BLOCK_M=[64, 128, 256], BLOCK_N=[64, 128, 256], KV_LATENCY=[0], occupancy=[1],
                num_worker_warps=[4, 8])
    values = _same(sm90)
    values["sm_100"]["occupancy"] = [1, 2]
    for a in ("sm_80", *_SMALL_SMEM):
        values[a].update(BLOCK_M=[64, 128], BLOCK_N=[32, 64, 128], occupancy=[1, 2])
    if head_dim > 128:  # the O accumulator doubles: smaller tiles
        for a in ARCHS:
            values[a]["BLOCK_M"] = [b for b in values[a]["BLOCK_M"] if b <= 128]
            values[a]["BLOCK_N"] = [b for b in values[a]["BLOCK_N"] if b <= 128]
    rules = [Rule.of("fits", score_tile_fits)]
    if head_dim <= 64:  # the library's small-head space: occupancy 2-4 for score tiles up to 128 x 128
        values["sm_90"]["occupancy"] = [1, 2, 4]
        rules.append(Rule.of("in_flight", score_tile_in_flight, 128 * 128))
    elif head_dim <= 128:  # heads of 128: occupancy 2 for score tiles up to 64 x 128, no tile that spills
        values["sm_90"]["occupancy"] = [1, 2]
        rules.append(Rule.of("in_flight", score_tile_in_flight, 64 * 128))
        rules.append(Rule.of("registers", attention_registers_fit, head_dim))
    base = dict(BLOCK_M=128, BLOCK_N=64, KV_LATENCY=0, occupancy=1, num_worker_warps=4)
    return _finish("fmha", f"fmha(head_dim={head_dim})", values, rules, {"sm_90": base})


# --------------------------------------------------------------------------------------------
# the catalogue
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """One entry of the catalogue.

    Attributes:
        name: the template's name (``tiletune.lab.catalogue.template(name)``).
        kind: ``"memory-bound"``, ``"balanced"`` or ``"compute-bound"``.
        kernels: the kernels it is for, in words.
        knobs: what its parameters are.
        evidence: where its ``sm_90`` values come from (a library op and result files).
        example: keyword arguments of the documented example.
    """

    name: str
    kind: str
    kernels: str
    knobs: str
    evidence: str
    make: Callable[..., Recipe] = field(repr=False)
    example: Mapping[str, Any] = field(default_factory=dict)

    def recipe(self, **kwargs: Any) -> Recipe:
        """The template instance for ``kwargs`` (see the template's arguments in ``docs/TEMPLATES.md``)."""
        known = self.arguments()
        unknown = [k for k in kwargs if k not in known]
        if unknown:
            raise ValueError(f"template {self.name!r} has no argument(s) {', '.join(map(repr, unknown))}; "
                             f"its arguments are: {', '.join(f'{k}={v!r}' for k, v in known.items()) or 'none'}")
        return self.make(**kwargs)

    def space(self, **kwargs: Any) -> Space:
        """The template's :class:`~tiletune.Space` for ``kwargs``."""
        return self.recipe(**kwargs).space()

    def code(self, var: str = "space", **kwargs: Any) -> str:
        """Python source building :meth:`space` (``import tiletune as tt`` ... ``space = tt.Space(...)``)."""
        return self.recipe(**kwargs).code(var)

    def arguments(self) -> dict[str, Any]:
        """The template's arguments and their defaults."""
        import inspect

        return {n: p.default for n, p in inspect.signature(self.make).parameters.items()}


_GEMM_EVIDENCE = ("library op tiletune.gemm (tiletune.space.templates.matmul_space), shrunk from "
                  "benchmarks/spaces/h200_gemm_bf16_4096.json.gz; winners in benchmarks/results/h200/"
                  "kernels_compute.json")

TEMPLATES: dict[str, Template] = {t.name: t for t in (
    Template("elementwise", "memory-bound",
             "elementwise / occupancy-only streams: activations, gated activations (GLU), casts, adds",
             "TILE (elements per tile) x occupancy x num_worker_warps, 8-32 values per thread",
             "library ops tiletune.swiglu / tiletune.geglu (tiletune.space.templates.elementwise_space); "
             "benchmarks/results/h200/probe_memory.json.gz, kernels_memory.json",
             _elementwise),
    Template("rowwise", "balanced",
             "row reductions and norms: RMSNorm, LayerNorm, softmax, fused residual + norm",
             "TM rows per tile or CHUNK columns per pass, occupancy, LAT (load latency hint), STORE_TMA",
             "library ops tiletune.rms_norm / layer_norm / softmax (tiletune.space.templates.rowwise_space); "
             "benchmarks/spaces/h200_layernorm_bf16_16384x4096.json.gz, benchmarks/results/h200/kernels_memory.json, "
             "probe_memory.json.gz (rows shorter than 4096: more rows per tile)",
             _rowwise, {"n_cols": 4096, "dtype_bytes": 2}),
    Template("cross_entropy", "balanced",
             "chunked cross-entropy over a large vocabulary (online max/sum per row chunk), loss or grad",
             "CHUNK columns per pass x occupancy x PREFETCH (an allow-list of triples), LAT, STORE_TMA, worker warps",
             "library ops tiletune.cross_entropy / cross_entropy_grad; benchmarks/results/h200/"
             "probe_ce_tail.json.gz (the plain-load configs timed against TMA)",
             _cross_entropy, {"pass_": "loss"}),
    Template("rope", "memory-bound",
             "rotary position embedding applied in place to q and k",
             "TS positions per tile x occupancy x num_worker_warps (an allow-list of bytes in flight)",
             "library op tiletune.rope (tiletune.space.templates.rope_space); benchmarks/results/h200/kernels_memory.json",
             _rope, {"heads_elems": 2048}),
    Template("matmul", "compute-bound",
             "tensor-core GEMM (ct.mma), batched or persistent",
             "TM x TN output tile, TK depth (same bytes per stage for every width), occupancy, worker "
             "warps; num_ctas on sm_100",
             _GEMM_EVIDENCE, _matmul, {"elem_bytes": 2}),
    Template("fmha", "compute-bound",
             "fused multi-head attention forward (two ct.mma per key tile, online softmax)",
             "BLOCK_M query rows x BLOCK_N keys per step, KV_LATENCY, occupancy, worker warps",
             "library op tiletune.attention (ATTENTION_SPACE), shrunk from benchmarks/spaces/"
             "h200_attention_bf16_b4h16s4096d128_causal.json.gz; kernels_compute.json",
             _fmha, {"head_dim": 128}),
    Template("dual_gemm", "compute-bound",
             "fused dual GEMM of GLU MLPs: act(x @ W_gate) * (x @ W_up), two accumulators per block",
             "TM x TN tile of each product (two accumulators), TK, occupancy, worker warps",
             "no library op: sm_90 values derived from the GEMM recording (the accumulator and stage "
             "budgets of tiletune.gemm's winners, halved per product); not measured as a dual GEMM",
             _dual_gemm, {"elem_bytes": 2}),
    Template("grouped_gemm", "compute-bound",
             "persistent grouped GEMM: one launch over ragged groups (MoE experts), tiles walked by a "
             "persistent grid",
             "TM (<= 128: groups are short) x TN x TK, occupancy (also the persistent grid), worker warps",
             "no library op: the persistent tiletune.gemm space without 256-row tiles; its small-M "
             "winners in kernels_compute.json; not measured as a grouped GEMM",
             _grouped_gemm, {"elem_bytes": 2}),
)}


def template(name: str) -> Template:
    """The catalogue entry ``name``; ValueError naming the templates otherwise."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown template {name!r}; templates are: {', '.join(TEMPLATES)}") from None

