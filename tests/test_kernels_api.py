"""CPU tests of the memory-bound op library: argument checks, spaces, plans and torch references.

Nothing here needs a GPU or the TileIR assembler: CPU tensors exercise the torch-like error
messages (every check but the device check runs before it), launch plans are called with a fake SM
count, and the references are compared with plain torch formulas. GPU correctness lives in
``tests/test_gpu_kernels_memory.py``.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

import tiletune as tt  # noqa: E402
import tiletune.kernels as K  # noqa: E402
import importlib  # noqa: E402

from tiletune.kernels import _membound, norms, rope  # noqa: E402
from tiletune.devices.verify import SCRATCH  # noqa: E402
from tiletune.kernels import glu as glu_mod  # noqa: E402

softmax_mod = importlib.import_module("tiletune.kernels.softmax_op")
ce_mod = importlib.import_module("tiletune.kernels.cross_entropy_op")
from tiletune.space.templates import (  # noqa: E402
    ROW_MAX_ELEMS,
    SHORT_ROWS_VALUES_PER_SM,
    chunked_row_space,
    cross_entropy_loss_triples,
    elementwise_space,
    fits_registers,
    next_power_of_2,
    rope_space,
    row_regime,
    rowwise_space,
)

F = torch.nn.functional
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture
def fake_sms(monkeypatch):
    monkeypatch.setattr(_membound, "sm_count", lambda device_index: 132)
    return 132


# ---------------------------------------------------------------------------------------------
# argument checks (CPU tensors)
# ---------------------------------------------------------------------------------------------

def _cpu_calls():
    """Calls with correct dtypes and shapes, on the CPU: each must refuse the device."""
    x = torch.randn(4, 8)
    return {
        "rms_norm": lambda: K.rms_norm(x, torch.ones(8)),
        "rms_norm_residual": lambda: K.rms_norm_residual(x, x.clone(), torch.ones(8)),
        "layer_norm": lambda: K.layer_norm(x, torch.ones(8), torch.zeros(8)),
        "softmax": lambda: K.softmax(x),
        "swiglu": lambda: K.swiglu(x),
        "geglu": lambda: K.geglu(x, approximate="tanh"),
        "apply_rope_": lambda: K.apply_rope_(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8),
                                             torch.randn(3, 8), torch.randn(3, 8)),
        "cross_entropy": lambda: K.cross_entropy(x, torch.zeros(4, dtype=torch.long)),
    }


@pytest.mark.parametrize("name", list(_cpu_calls()))
def test_cpu_tensors_are_refused_with_a_clear_error(name):
    with pytest.raises(ValueError, match=r"expected CUDA tensors .* on cpu"):
        _cpu_calls()[name]()


@pytest.mark.parametrize(
    "call",
    [
        lambda: K.rms_norm(torch.randn(4, 8, dtype=torch.float64), None),
        lambda: K.rms_norm(torch.randn(4, 8), torch.ones(8, dtype=torch.float64)),
        lambda: K.rms_norm(torch.ones(4, 8, dtype=torch.int32), None),
        lambda: K.rms_norm_residual(torch.randn(4, 8), torch.randn(4, 8, dtype=F16), None),
        lambda: K.layer_norm(torch.randn(4, 8, dtype=torch.float64)),
        lambda: K.layer_norm(torch.randn(4, 8), None, torch.zeros(8, dtype=torch.int64)),
        lambda: K.softmax(torch.arange(8)),
        lambda: K.swiglu(torch.randn(4, 8, dtype=torch.float64)),
        lambda: K.geglu(torch.randn(4, 8).to(torch.complex64)),
        lambda: K.apply_rope_(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8, dtype=BF16),
                              torch.randn(3, 8), torch.randn(3, 8)),
        lambda: K.apply_rope_(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8),
                              torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8)),
        lambda: K.cross_entropy(torch.randn(4, 8, dtype=torch.float64), torch.zeros(4, dtype=torch.long)),
        lambda: K.cross_entropy(torch.randn(4, 8), torch.zeros(4)),
        lambda: K.cross_entropy(torch.randn(4, 8), torch.zeros(4, dtype=torch.long), ignore_index=1.5),
        lambda: K.rms_norm([1.0, 2.0], None),
        lambda: K.cross_entropy(torch.randn(4, 8), [0, 1, 2, 3]),
    ],
)
def test_wrong_dtypes_and_types_raise_type_error(call):
    with pytest.raises(TypeError):
        call()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: K.rms_norm(torch.randn(4, 8), torch.ones(7)), r"'weight' must have shape \(8,\)"),
        (lambda: K.rms_norm(torch.randn(4, 8), torch.ones(2, 4)), r"'weight' must have shape"),
        (lambda: K.rms_norm(torch.tensor(1.0), None), r"at least one dimension"),
        (lambda: K.rms_norm(torch.randn(4, 0), None), r"must not be empty"),
        (lambda: K.rms_norm_residual(torch.randn(4, 8), torch.randn(4, 9)), r"'residual' must have the shape"),
        (lambda: K.layer_norm(torch.randn(4, 8), torch.ones(8), torch.zeros(9)), r"'bias' must have shape"),
        (lambda: K.softmax(torch.randn(4, 8), dim=2), r"dim 2 is out of range"),
        (lambda: K.swiglu(torch.randn(4, 7)), r"must be even"),
        (lambda: K.geglu(torch.randn(4, 8), approximate="erf"), r"approximate must be"),
        (lambda: K.apply_rope_(torch.randn(3, 2, 8), torch.randn(3, 1, 8), torch.randn(3, 8), torch.randn(3, 8)),
         r"must be 4-D"),
        (lambda: K.apply_rope_(torch.randn(1, 3, 2, 8), torch.randn(1, 4, 1, 8), torch.randn(3, 8), torch.randn(3, 8)),
         r"differ in batch, sequence or head"),
        (lambda: K.apply_rope_(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8), torch.randn(4, 8), torch.randn(4, 8)),
         r"cos/sin must be"),
        (lambda: K.apply_rope_(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8), torch.randn(3, 10),
                               torch.randn(3, 10)), r"rotary dimension"),
        (lambda: K.apply_rope_(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8), torch.randn(3, 8), torch.randn(3, 6)),
         r"must have one shape"),
        (lambda: K.apply_rope_(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8), torch.randn(3, 8), torch.randn(3, 8),
                               layout="sbhd"), r"layout must be"),
        (lambda: K.apply_rope_(torch.randn(1, 3, 2, 16)[..., ::2], torch.randn(1, 3, 1, 8), torch.randn(3, 8),
                               torch.randn(3, 8)), r"unit stride"),
        (lambda: K.cross_entropy(torch.randn(4, 8), torch.zeros(5, dtype=torch.long)), r"'target' must have shape \(4,\)"),
    ],
)
def test_shape_mismatches_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_device_mismatch_names_every_tensor():
    with pytest.raises(ValueError, match=r"'x' on cpu, 'weight' on meta"):
        K.rms_norm(torch.randn(4, 8), torch.ones(8, device="meta"))


# ---------------------------------------------------------------------------------------------
# package exports
# ---------------------------------------------------------------------------------------------

def test_public_ops_are_exported_and_callable():
    for name in ("rms_norm", "rms_norm_residual", "layer_norm", "softmax", "swiglu", "geglu", "apply_rope_",
                 "cross_entropy"):
        assert name in K.__all__
        assert callable(getattr(K, name))
    # importing the op modules never shadows the functions (torch.compile must see functions)
    import types

    for name in ("softmax", "cross_entropy", "attention"):
        importlib.import_module(f"tiletune.kernels.{name}_op")
        assert isinstance(getattr(K, name), types.FunctionType), name


# ---------------------------------------------------------------------------------------------
# templates and spaces
# ---------------------------------------------------------------------------------------------

ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120")


def _sizes(space):
    return {a: len(space.candidates(a)) for a in ARCHS}


@pytest.mark.parametrize("n", [1, 7, 64, 1000, 1024, 2048, 4096, 5120, 8192, 12288, 16384, 16385, 65536, 256000])
@pytest.mark.parametrize("streams", [1, 2])
def test_rowwise_spaces_are_small_and_valid_everywhere(n, streams):
    space = rowwise_space(n, 2, streams=streams)
    for arch, size in _sizes(space).items():
        # short rows also try the non-persistent grid and occupancy 8-16 for small tiles (32 at most)
        assert 2 <= size <= (32 if row_regime(n, streams) == "rows" else 12), (n, arch, size)
        base = space.baseline(arch)
        assert base is not None and base in set(space.candidates(arch))
        for cfg in space.candidates(arch):
            tile = cfg.CHUNK if cfg.CHUNK else cfg.TM * next_power_of_2(n)
            if row_regime(n, streams) == "rows":  # short rows: the in-flight bound measured on the H200
                assert tile <= ROW_MAX_ELEMS and tile * cfg.occupancy * streams <= SHORT_ROWS_VALUES_PER_SM
            else:
                assert fits_registers(tile, cfg.occupancy, streams)


def test_short_rows_try_more_rows_per_tile():
    """Rows under 4096 padded elements: 1, 2 and 4 times the default rows per tile (the probe's
    winners for 1024-wide rows had 2-4x), the default at occupancy 2 as the baseline, and the
    previous space's baseline still in the space."""
    from tiletune.space.templates import rows_per_tile, short_rows_space

    for n, streams in ((1024, 1), (1024, 2), (2048, 1), (100, 2), (1000, 1)):
        space = rowwise_space(n, 2, streams=streams)
        assert space.hash == short_rows_space(n, streams=streams).hash
        tm = rows_per_tile(n)
        assert {c.TM for c in space.candidates("sm_90")} == {tm, 2 * tm, 4 * tm}
        base = space.baseline("sm_90")
        assert (base.TM, base.occupancy, base.LAT, base.STORE_TMA) == (tm, 2, 0, True)
    probe_best = {"layer_norm": (2, 16, 2), "softmax": (1, 8, 2), "rms_norm": (1, 8, 4)}  # streams, TM, occupancy
    for op, (streams, tm, occ) in probe_best.items():
        cfgs = {(c.TM, c.occupancy) for c in rowwise_space(1024, 2, streams=streams).candidates("sm_90")}
        assert (tm, occ) in cfgs, op
    assert {c.TM for c in rowwise_space(7, 2).candidates("sm_90")} == {256}  # capped at 256 rows
    assert {c.num_worker_warps for c in rowwise_space(1000, 2, tma=False).candidates("sm_90")} == {4, 8}


def test_short_rows_try_the_non_persistent_grid_and_high_occupancy_on_small_tiles():
    """The 2026-12-01 23:53 H200 probe (``benchmarks/probe_rows.py``): one block per row block beat the
    persistent grid for softmax (4 rows x occupancy 16) and RMSNorm (8 rows x 4) at 65536 x 1024; 8-row
    tiles at occupancy 8 spilled (1.8-3.2x slower). Those winners are in the space, the spilling pairs
    are not, and the non-persistent GRID_FRAC launches one block per row block."""
    from unittest import mock

    import tiletune.kernels._membound as mb
    from tiletune.kernels.norms import _grid
    from tiletune.space.templates import SHORT_ROWS_GRID_ALL, SHORT_ROWS_HIGH_OCCUPANCY_TILE

    for streams in (1, 2):
        cands = rowwise_space(1024, 2, streams=streams).candidates("sm_90")
        assert {c.GRID_FRAC for c in cands} == {1.0, SHORT_ROWS_GRID_ALL}
        for c in cands:
            assert c.TM * 1024 * c.occupancy * streams <= SHORT_ROWS_VALUES_PER_SM
            assert c.occupancy <= 4 or c.TM * 1024 <= SHORT_ROWS_HIGH_OCCUPANCY_TILE
        assert (8, 8) not in {(c.TM, c.occupancy) for c in cands}
    winners = {(4, 16, SHORT_ROWS_GRID_ALL), (8, 4, SHORT_ROWS_GRID_ALL), (8, 2, 1.0)}
    assert winners <= {(c.TM, c.occupancy, c.GRID_FRAC) for c in rowwise_space(1024, 2).candidates("sm_90")}
    assert "GRID_FRAC" not in rowwise_space(4096, 2).names  # one row per tile: unchanged
    with mock.patch.object(mb, "sm_count", lambda dev: 132):
        cfg = rowwise_space(1024, 2).config("sm_90", TM=4, CHUNK=0, occupancy=16, LAT=0, STORE_TMA=True,
                                            GRID_FRAC=SHORT_ROWS_GRID_ALL)
        assert _grid(cfg, 65536, 4, 0) == (16384,)  # every row block its own block
        assert _grid(cfg.replace(GRID_FRAC=1.0), 65536, 4, 0) == (132 * 16,)


def test_rows_that_cannot_use_tma_get_the_plain_load_space():
    from tiletune.space.templates import tma_rows

    assert tma_rows(4096, 4096, 2) and tma_rows(8, 8, 2)
    assert not tma_rows(4, 4, 2)  # a padded row under 16 bytes
    assert not tma_rows(1000, 1001, 2) and tma_rows(1000, 1008, 2)  # the row stride decides
    # rows whose bytes are not a multiple of 16 inside an aligned stride: TMA stores wrote the gaps (sm_90)
    assert not tma_rows(1001, 1008, 2) and not tma_rows(5, 8, 2) and not tma_rows(3, 4, 4)
    plain = rowwise_space(1001, 2, tma=False)
    assert {c.LAT for c in plain.candidates("sm_90")} == {0}
    # plain stores: a store allowed TMA wrote past the end of (7, 1) and (5, 1) outputs on sm_90
    assert {c.STORE_TMA for c in plain.candidates("sm_90")} == {False}
    assert plain.baseline("sm_90").STORE_TMA is False
    assert {c.STORE_TMA for c in rowwise_space(1, 2).candidates("sm_90")} == {False}
    assert {c.STORE_TMA for c in rowwise_space(1, 4, streams=2).candidates("sm_90")} == {False}
    assert {c.STORE_TMA for c in rowwise_space(50257, 2, tma=False).candidates("sm_90")} == {False}
    assert {c.STORE_TMA for c in rowwise_space(4096, 2).candidates("sm_90")} == {False, True}
    assert {c.num_worker_warps for c in plain.candidates("sm_90")} == {4, 8}
    assert {c.LAT for c in rowwise_space(1, 2).candidates("sm_90")} == {0}  # 2-byte rows: tma is off
    assert {c.LAT for c in rowwise_space(1024, 2).candidates("sm_90")} == {0}  # short rows: no latency hint
    assert {c.LAT for c in rowwise_space(4096, 2).candidates("sm_90")} == {0, 10}
    big = rowwise_space(50257, 2, tma=False)
    assert {c.CHUNK for c in big.candidates("sm_90")} == {2048, 4096}
    # the ops' regimes carry the TMA decision
    assert norms.prepare_rms_norm(torch.randn(4, 1001), None).regime[:2] == (1024, False)
    assert norms.prepare_rms_norm(torch.randn(4, 1000), None).regime[:2] == (1024, True)
    assert norms.prepare_rms_norm(torch.randn(4, 1024)[:, :1000], None).regime[:2] == (1024, True)
    assert norms.prepare_rms_norm_residual(torch.randn(4, 1000), torch.randn(4, 1001)[:, :1000],
                                           None).regime[:2] == (1024, False)
    assert softmax_mod.prepare_softmax(torch.randn(2, 50257)).regime == ("chunked", False)
    # one-element rows (the GPU suite's (7, 1) and (5, 1)) are plain-store regimes
    assert norms.prepare_rms_norm(torch.randn(7, 1), None).regime[:2] == (1, False)
    assert norms.prepare_layer_norm(torch.randn(7, 1), None, None).regime[:2] == (1, False)
    assert softmax_mod.prepare_softmax(torch.randn(7, 1)).regime == (1, False)


def test_row_regimes():
    assert [row_regime(n) for n in (1, 2048, 4096, 16384, 16385)] == ["rows", "rows", "row", "row", "chunked"]
    assert row_regime(8192, streams=2) == "row" and row_regime(8193, streams=2) == "chunked"
    assert rowwise_space(3000).candidates("sm_90")[0].TM == 1
    assert rowwise_space(100).candidates("sm_90")[0].TM == 32  # 32 rows of 128 padded columns


def test_elementwise_chunked_and_rope_spaces():
    e = elementwise_space()
    assert len(e.candidates("sm_90")) == 16
    for c in e.candidates("sm_90"):
        assert 8 <= c.TILE // (32 * c.num_worker_warps) <= 32
        assert 8192 <= c.TILE * c.occupancy <= 65536
    c = chunked_row_space(10**5, chunks=(4096, 8192, 16384), lat=(0, 10))
    assert len(c.candidates("sm_90")) == 12
    wide = chunked_row_space(10**5, chunks=(8192, 16384), occupancies=(2,), values_per_sm=32768, worker_warps=(4, 8))
    assert {(c.CHUNK, c.num_worker_warps) for c in wide.candidates("sm_90")} == {
        (8192, 4), (8192, 8), (16384, 4), (16384, 8)}
    assert len(ce_mod.loss_space().candidates("sm_90")) == 8
    for he in (64, 512, 2048):
        r = rope_space(he)
        assert 3 <= len(r.candidates("sm_90")) <= 12
    assert len(rope_space(8192).candidates("sm_90")) >= 1
    assert ce_mod.loss_space().hash != ce_mod.grad_space().hash
    grad = ce_mod.grad_space().candidates("sm_90")
    assert len(grad) == 4 and {c.PREFETCH for c in grad} == {True} and {c.STORE_TMA for c in grad} == {False}
    # the loss space: its triples, at most 65536 chunk values per SM in registers (two chunks with PREFETCH)
    loss = ce_mod.loss_space().candidates("sm_90")
    assert {(c.CHUNK, c.occupancy, c.PREFETCH) for c in loss} == cross_entropy_loss_triples()
    assert all(c.CHUNK * c.occupancy * (2 if c.PREFETCH else 1) <= 65536 for c in loss)
    assert ce_mod.loss_space().baseline("sm_90") in loss


def test_space_hashes_are_stable_across_calls():
    assert rowwise_space(4096).hash == rowwise_space(4096).hash
    assert rope_space(2048).hash == rope_space(2048).hash
    assert rowwise_space(4096).hash != rowwise_space(4096, streams=2).hash


# ---------------------------------------------------------------------------------------------
# plans (fake SM count) and prepared calls on CPU tensors
# ---------------------------------------------------------------------------------------------

def _prepared_cases():
    x = torch.randn(6, 1000)
    big = torch.randn(5, 4096)
    q, k = torch.randn(2, 5, 4, 16), torch.randn(2, 5, 2, 16)
    return [
        norms.prepare_rms_norm(x, torch.randn(1000)),
        norms.prepare_rms_norm(big[:, :3000], None),
        norms.prepare_rms_norm(torch.randn(3, 40000), torch.randn(40000)),
        norms.prepare_rms_norm_residual(x, torch.randn(6, 1000), torch.randn(1000)),
        norms.prepare_layer_norm(x, torch.randn(1000), torch.randn(1000)),
        norms.prepare_layer_norm(torch.randn(2, 20000), None, None),
        softmax_mod.prepare_softmax(x),
        softmax_mod.prepare_softmax(torch.randn(2, 70000)),
        glu_mod.prepare_glu(torch.randn(3, 7, 2 * 300), glu_mod.ACT_SILU),
        glu_mod.prepare_glu(torch.randn(3, 2 * 300), glu_mod.ACT_GELU_ERF),
        rope.prepare_rope(q, k, torch.randn(5, 16), torch.randn(5, 16)),
        rope.prepare_rope(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), torch.randn(2, 5, 12),
                          torch.randn(2, 5, 12), "bhsd"),
        ce_mod.prepare_cross_entropy(torch.randn(4, 3000), torch.randint(0, 3000, (4,))),
        ce_mod.prepare_cross_entropy(torch.randn(4, 3000), torch.randint(0, 3000, (4,)), True),
    ]


def test_every_config_of_every_plan_gives_a_valid_launch(fake_sms):
    for prep in _prepared_cases():
        space = prep.family.space_for(prep.regime)
        for arch in ("sm_90", "sm_100"):
            for cfg in space.candidates(arch):
                spec = prep.family.plan(cfg, *prep.args)
                assert isinstance(spec, tt.Launch)
                params = spec.kernel._annotated_function.parameter_annotations
                assert len(params) == len(spec.args), prep.family.name
                assert len(spec.grid) == 1 and 1 <= spec.grid[0] <= fake_sms * cfg.occupancy
                for a in spec.args:  # every tensor the kernel sees is a call argument (hot-path recipe)
                    if isinstance(a, torch.Tensor):
                        assert any(a is b for b in prep.args)


def test_strided_rows_are_read_in_place_not_copied():
    big = torch.randn(8, 4096)
    x2 = _membound.as_rows(big[:, :3000])
    assert x2.data_ptr() == big.data_ptr() and x2.stride() == (4096, 1)
    assert _membound.as_rows(big.t()).is_contiguous()  # column-major input: copied to rows
    assert _membound.as_rows(torch.randn(2, 3, 5)).shape == (6, 5)


def test_int64_twins_and_the_index_limit():
    from cuda.tile import IndexedWithInt64

    k = norms.rms_norm_kernel_i64
    assert k is not norms.rms_norm_kernel
    ann = k._annotated_function.pyfunc.__annotations__
    assert ann["X"] is IndexedWithInt64 and ann["Y"] is IndexedWithInt64 and "W" not in ann
    assert not _membound.needs_int64(torch.empty(4096, 4096, device="meta"))
    assert _membound.needs_int64(torch.empty(65536, 65536, device="meta"))
    assert _membound.needs_int64(torch.empty(2, 2**31, device="meta")[:, :8])  # a long row stride


# ---------------------------------------------------------------------------------------------
# references: the tuner's correctness gate must be right
# ---------------------------------------------------------------------------------------------

def _rms_norm_elementwise(x, w, eps):
    """RMSNorm written out element by element in Python floats (float64), independent of the library's
    vectorized formula: y[i][j] = x[i][j] / sqrt(sum_k x[i][k]^2 / n + eps) * w[j]."""
    rows = x.double().tolist()
    ws = w.double().tolist() if w is not None else None
    out = []
    for row in rows:
        n = len(row)
        ms = sum(v * v for v in row) / n
        inv = 1.0 / math.sqrt(ms + eps)
        out.append([v * inv * (ws[j] if ws is not None else 1.0) for j, v in enumerate(row)])
    return torch.tensor(out, dtype=torch.float64)


def test_rms_norm_references_match_an_independent_computation():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 33, generator=gen) * 3 + 0.5, torch.randn(33, generator=gen)
    for eps in (1e-6, 0.5):  # a large eps shows whether (and where) it is added
        want = _rms_norm_elementwise(x, w, eps)
        got = norms.rms_norm_reference(x, w, torch.empty_like(x), eps, True)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
        got = norms.rms_norm_reference(x, None, torch.empty_like(x), eps, False)  # no weight
        torch.testing.assert_close(got.double(), _rms_norm_elementwise(x, None, eps), rtol=1e-6, atol=1e-6)
        if hasattr(F, "rms_norm"):  # torch's own RMSNorm agrees too
            torch.testing.assert_close(got, F.rms_norm(x, (33,), None, eps))
    # the demo op's reference (tiletune.lab.examples.rmsnorm) agrees as well
    from tiletune.lab.examples import rmsnorm as demo_rms

    torch.testing.assert_close(demo_rms._reference(x, w, torch.empty_like(x), 1e-6).double(),
                               _rms_norm_elementwise(x, w, 1e-6), rtol=1e-6, atol=1e-6)
    # a bf16 output is the float result rounded once (not computed in bf16)
    xb = x.to(BF16)
    got = norms.rms_norm_reference(xb, w, torch.empty_like(xb), 1e-6, True)
    assert got.dtype == BF16
    want = _rms_norm_elementwise(xb, w, 1e-6)
    torch.testing.assert_close(got.double(), want, rtol=2.0**-8, atol=0.0)  # within one bf16 rounding


def test_norm_references_match_torch():
    x, w, b = torch.randn(5, 33), torch.randn(33), torch.randn(33)
    y = torch.empty_like(x)
    torch.testing.assert_close(norms.layer_norm_reference(x, w, b, y, 1e-5, True, True),
                               F.layer_norm(x, (33,), w, b, 1e-5))
    r = torch.randn(5, 33).to(BF16)
    xb = x.to(BF16)
    yy, hh = norms.rms_norm_residual_reference(xb, r, w, xb.clone(), xb.clone(), 1e-6, True)
    h = (xb.float() + r.float()).to(BF16)
    assert torch.equal(hh, h)
    # y is the RMSNorm of the rounded sum h, checked against the element-by-element reference
    torch.testing.assert_close(yy.double(), _rms_norm_elementwise(h, w, 1e-6).to(BF16).double())


def test_softmax_and_glu_references():
    x = torch.randn(3, 10)
    torch.testing.assert_close(softmax_mod.softmax_reference(x, x), torch.softmax(x, -1))
    z = torch.randn(4, 2 * 6)
    for act, fn in ((glu_mod.ACT_SILU, F.silu), (glu_mod.ACT_GELU_TANH, lambda g: F.gelu(g, approximate="tanh")),
                    (glu_mod.ACT_GELU_ERF, F.gelu)):
        prep = glu_mod.prepare_glu(z, act)
        gate, up, y, a = prep.args
        torch.testing.assert_close(glu_mod.glu_reference(gate, up, y, a), fn(z[:, :6]) * z[:, 6:])


def _hf_rope(x, cos, sin):
    """Hugging Face's apply_rotary_pos_emb on the first R dims; (B, S, H, D) x with (S, R) or (B, S, R) cos."""
    r = cos.shape[-1]
    c = cos.unsqueeze(-2) if cos.dim() == 3 else cos[None, :, None, :]
    s = sin.unsqueeze(-2) if sin.dim() == 3 else sin[None, :, None, :]
    xr, rest = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    rot = torch.cat((-x2, x1), dim=-1)
    return torch.cat((xr * c + rot * s, rest), dim=-1)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("r, cos_batch", [(16, None), (12, 2), (16, 1)])
def test_rope_reference_through_half_views_matches_hugging_face(layout, r, cos_batch):
    b, s, hq, hk, d = 2, 5, 4, 2, 16
    q4, k4 = torch.randn(b, s, hq, d), torch.randn(b, s, hk, d)
    shape = (s, r) if cos_batch is None else (cos_batch, s, r)
    ang = torch.randn(*shape)
    cos, sin = ang.cos(), ang.sin()  # general cos/sin (halves differ): the kernel reads both halves
    q_in, k_in = (q4, k4) if layout == "bshd" else (q4.transpose(1, 2).contiguous(), k4.transpose(1, 2).contiguous())
    q_exp, k_exp = _hf_rope(q4, cos, sin), _hf_rope(k4, cos, sin)
    prep = rope.prepare_rope(q_in.clone(), k_in.clone(), cos, sin, layout)
    outs = rope.rope_reference(*prep.args)
    for view, val in zip(prep.args[:4], outs):  # write the expected halves through the in-place views
        view.copy_(val)
    q_out, k_out = prep.result
    if layout == "bhsd":
        q_out, k_out = q_out.transpose(1, 2), k_out.transpose(1, 2)
    torch.testing.assert_close(q_out, q_exp)
    torch.testing.assert_close(k_out, k_exp)


@pytest.mark.parametrize("ignore", [False, True])
def test_cross_entropy_references_match_autograd(ignore):
    m, v = 6, 37
    logits = torch.randn(m, v, requires_grad=True)
    target = torch.randint(0, v, (m,))
    if ignore:
        target[1] = target[4] = -100
    loss = F.cross_entropy(logits, target, ignore_index=-100)
    (grad,) = torch.autograd.grad(loss, logits)
    lg = logits.detach()
    prep = ce_mod.prepare_cross_entropy(lg, target, True)
    got, g, part, sem = ce_mod.cross_entropy_grad_reference(*prep.args)
    assert part is SCRATCH
    assert got.shape == (1,) and sem.shape == (1,) and int(sem) == 0
    torch.testing.assert_close(got[0], loss.detach())
    torch.testing.assert_close(g, grad)
    got2, part2, sem2 = ce_mod.cross_entropy_reference(*ce_mod.prepare_cross_entropy(lg, target).args)
    assert part2 is SCRATCH
    torch.testing.assert_close(got2, got)
    assert math.isfinite(float(got2)) and int(sem2) == 0


def test_heads_of_64_tune_the_small_head_attention_space():
    """Attention is one library op with a regime per head size: D <= 64 tunes the small-head space (the 16
    configs plus occupancy 2-4 for score tiles up to 128 x 128: the 2026-12-02 H200 probe's winners, 64 x 64
    at occupancy 4 and 128 x 64 at 2-4); D = 128 the space its shipped-table entries were made with."""
    attn = importlib.import_module("tiletune.kernels.attention_op")
    from tiletune.kernels.library_op import LibraryOp
    from tiletune.resolve.tables import tables

    assert isinstance(attn.ATTENTION, LibraryOp) and attn.ATTENTION in LibraryOp.instances()
    assert [attn.attention_regime(d) for d in (32, 64, 80, 128)] == [attn.SMALL_HEAD, attn.SMALL_HEAD, None, None]
    small_op, op = attn.attention_op_for(64), attn.attention_op_for(128)
    assert small_op is attn.ATTENTION.op(attn.SMALL_HEAD) and op is attn.ATTENTION.op(None) and small_op is not op
    small, lib = attn.ATTENTION_SMALL_HEAD_SPACE, attn.ATTENTION_SPACE
    assert small_op.space is small and op.space is lib
    assert small_op.name == op.name == "tiletune.attention"
    assert small_op.plan is op.plan is attn.attention_plan
    cands = {(c.BLOCK_M, c.BLOCK_N, c.occupancy, c.num_worker_warps) for c in small.candidates("sm_90")}
    assert len(cands) == 40 and set(lib.candidates("sm_90")) <= set(small.candidates("sm_90"))
    assert {(64, 64, 4, 4), (128, 64, 2, 8), (128, 64, 4, 8)} <= cands
    assert all(o == 1 or m * n <= 128 * 128 for m, n, o, _ in cands)
    lib_cands = {(c.BLOCK_M, c.BLOCK_N, c.occupancy, c.num_worker_warps) for c in lib.candidates("sm_90")}
    assert len(lib_cands) == 17 and {(64, 128, 2, 4), (128, 64, 2, 4)} <= lib_cands  # two blocks per SM, D = 128
    assert all(o in (1, 2) and (o == 1 or m * n <= 64 * 128) for m, n, o, _ in lib_cands)
    # the shipped entries (D = 128) were tuned over this space: exact answers of its keys
    shipped = [e for t in tables() for e in t.entries.values() if e.name == "tiletune.attention"]
    assert shipped and all(e.space_hash == lib.hash for e in shipped)
    assert all(op.space.config(**e.config) in set(lib.candidates("sm_90")) for e in shipped)


def test_attention_routes_by_head_dim(monkeypatch):
    """The public call hands heads of 64 to the small-head op and heads of 128 to the other one."""
    pytest.importorskip("cuda.tile")
    import torch

    attn = importlib.import_module("tiletune.kernels.attention_op")
    calls = []
    ops = {attn.SMALL_HEAD: lambda *a: calls.append(("small", a[0].shape[-1])),
           None: lambda *a: calls.append(("d128", a[0].shape[-1]))}
    monkeypatch.setattr(attn.ATTENTION, "op", ops.__getitem__)
    monkeypatch.setattr(attn, "check_cuda_device", lambda *a, **k: None)
    monkeypatch.setattr(attn, "aligned_operand", lambda t: t)
    for d in (64, 128):
        q = torch.empty(1, 2, 32, d, dtype=torch.bfloat16, device="meta")
        attn.attention(q, q, q)
    assert calls == [("small", 64), ("d128", 128)]
