"""CPU checks of the three recorded spaces (persistent GEMM, attention, LayerNorm) and their helpers.

No GPU: the spaces' sizes and baselines, the launch-plan helpers (grid, hints, argument order
against the kernels' parameter lists), and one sm_90 cubin per space when cuTile's assembler is
installed (``tools/compile_check_all.py`` compiles every config).
"""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import pytest

ct = pytest.importorskip("cuda.tile")

from tiletune.kernels import attention_kernels as at  # noqa: E402
from tiletune.kernels import gemm_kernels as gk  # noqa: E402
from tiletune.lab.examples import layernorm_kernels as ln  # noqa: E402
from tiletune.space.spaces import Space  # noqa: E402


class Fake:
    def __init__(self, *shape):
        self.shape = shape


def _spaces():
    from tiletune.kernels.attention_op import ATTENTION_FULL_SPACE
    from tiletune.kernels.gemm import GEMM_FULL_SPACE

    ln_space = Space(**ln.LAYERNORM_SPACE_PARAMS, constraints=ln.LAYERNORM_CONSTRAINTS, baseline=ln.LAYERNORM_BASELINE)
    return {"gemm": GEMM_FULL_SPACE, "attention": ATTENTION_FULL_SPACE, "layernorm": ln_space}


def test_space_sizes_and_baselines():
    sizes = {n: s.size("sm_90") for n, s in _spaces().items()}
    assert sizes == {"gemm": 512, "attention": 330, "layernorm": 352}
    for s in _spaces().values():
        assert s.baseline("sm_90") is not None
        assert s.candidates("sm_90")[0] == s.baseline("sm_90")
        assert set(s.hint_names) == {"occupancy", "num_worker_warps"}


def test_gemm_constraints_and_helpers():
    for c in _spaces()["gemm"].configs("sm_90"):
        assert (c.TM + c.TN) * c.TK <= 24576
        assert c.TM * c.TN * c.occupancy <= 256 * 128
        assert c.TM * c.TN < 256 * 128 or c.num_worker_warps == 8
    cfg = SimpleNamespace(**gk.GEMM_BASELINE)
    assert gk.gemm_num_tiles(cfg, 4096, 4096) == 32 * 16
    assert gk.gemm_grid(cfg, 4096, 4096, 132) == (132,)
    assert gk.gemm_grid(cfg, 100, 100, 132) == (1,)
    assert gk.gemm_grid(dict(TM=64, TN=64, occupancy=2), 4096, 4096, 132) == (264,)
    assert gk.gemm_hints(cfg) == {"occupancy": 1, "num_worker_warps": 8}
    assert gk.gemm_hints(dict(TM=256, TN=128, occupancy=1)) == {"occupancy": 1, "num_worker_warps": 8}
    assert gk.gemm_hints(dict(TM=128, TN=128, occupancy=2)) == {"occupancy": 2}
    assert gk.gemm_num_tiles(cfg, 4096, 4096, batch=3) == 3 * 32 * 16
    assert gk.gemm_grid(cfg, 100, 100, 132, batch=5) == (5,)
    args = gk.gemm_args(dict(TM=64, TN=128, TK=32, LAT=4), "a", "b", "c", "sa", "sb", False, True)
    assert args == ("a", "b", "c", "sa", "sb", 64, 128, 32, 8, 4, 4, True, False, True, False, False)
    args = gk.gemm_args(dict(TM=64, TN=128, TK=32, FAST_ACC=True), "a", "b", "c", "sa", "sb", True, False, True)
    assert args[-5:] == (True, True, False, True, True)


def test_attention_helpers():
    cfg = dict(at.ATTENTION_BASELINE)
    q = Fake(4, 16, 4096, 128)
    assert at.attention_grid(cfg, q) == (32, 64)
    assert at.attention_grid(dict(BLOCK_M=256), Fake(1, 2, 1000, 64)) == (4, 2)
    assert at.attention_hints(cfg) == {"occupancy": 1, "num_worker_warps": 4}
    args = at.attention_args(cfg, q, "k", "v", "o", True, 0.125)
    assert args[1:4] == ("k", "v", "o")
    assert math.isclose(args[4], 0.125 / math.log(2))
    assert args[5:] == (128, 128, 64, True, 0)
    for c in _spaces()["attention"].configs("sm_90"):
        assert c.BLOCK_M * c.BLOCK_N <= 128 * 256


def test_attention_reference_matches_naive_math():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 33, 16, generator=g)
    k = torch.randn(2, 2, 40, 16, generator=g)
    v = torch.randn(2, 2, 40, 16, generator=g)
    for causal in (False, True):
        got = at.attention_reference(q, k, v, causal, 0.3)
        kk, vv = k.repeat_interleave(2, 1).double(), v.repeat_interleave(2, 1).double()
        s = (q.double() @ kk.transpose(-1, -2)) * 0.3
        if causal:
            s = s.masked_fill(~torch.ones(33, 40, dtype=torch.bool).tril(), float("-inf"))
        want = (s.softmax(-1) @ vv).float()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    qh = q.to(torch.bfloat16)  # the result comes back in q's dtype
    assert at.attention_reference(qh, k.to(torch.bfloat16), v.to(torch.bfloat16), True).dtype == torch.bfloat16


def test_layernorm_helpers():
    cfg = dict(ln.LAYERNORM_BASELINE)
    x = Fake(16384, 4096)
    assert ln.layernorm_tile_n(cfg, 4096) == 4096
    assert ln.layernorm_tile_n(dict(CHUNK_N=1024), 3000) == 1024
    assert ln.layernorm_tile_n(dict(CHUNK_N=4096), 1000) == 1024
    assert ln.layernorm_grid(cfg, 16384, 132) == (264,)
    assert ln.layernorm_grid(dict(PERSISTENT=False, ROWS=4), 16384, 132) == (4096,)
    assert ln.layernorm_grid(dict(PERSISTENT=True, ROWS=8, occupancy=8), 20, 132) == (3,)
    args = ln.layernorm_args(cfg, x, "w", "b", "y", 1e-5)
    assert args[1:5] == ("w", "b", "y", 1e-5)
    assert args[5:] == (1, 4096, True, True, True, 0)
    assert ln.layernorm_args(dict(ROWS=2, CHUNK_N=1024, PERSISTENT=False, LATENCY=4), Fake(8, 3000),
                             0, 0, 0, 1e-5)[5:] == (2, 1024, False, False, False, 4)


def test_layernorm_reference():
    torch = pytest.importorskip("torch")
    x = torch.randn(5, 37, dtype=torch.float64)
    w, b = torch.randn(37, dtype=torch.float64), torch.randn(37, dtype=torch.float64)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    want = (x - mean) / torch.sqrt(var + 1e-5) * w + b
    torch.testing.assert_close(ln.layernorm_reference(x, w, b, 1e-5), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("space", ["gemm", "attention", "layernorm"])
def test_baseline_compiles_for_sm90(space):
    """The baseline's kernel arguments match the kernel's parameters and assemble to a cubin."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    try:
        import compile_check_all as cca
    except Exception as exc:  # pragma: no cover - tools/ missing
        pytest.skip(f"tools/compile_check_all.py not importable: {exc}")
    from cuda.tile.compilation import export_kernel

    sd = cca.space_defs()[space]
    cfg = sd.space.baseline("sm_90").as_dict()
    kernel = sd.kernel.replace_hints(**sd.hints(cfg))
    buf = io.BytesIO()
    try:
        export_kernel(kernel, [cca.signature(sd.variants[0].make_args(cfg))], buf, gpu_code="sm_90",
                      output_format="cubin")
    except Exception as exc:
        if "tileiras" in str(exc).lower() and "not found" in str(exc).lower():
            pytest.skip(f"no TileIR assembler: {exc}")
        raise
    assert len(buf.getvalue()) > 1000
