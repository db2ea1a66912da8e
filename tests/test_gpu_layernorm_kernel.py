"""GPU checks of the LayerNorm kernel (``tiletune.lab.examples.layernorm_kernels``), launched directly.

Run on the GPU host: ``source .gpu/activate.sh && python -m pytest -m gpu -q tests/test_gpu_layernorm_kernel.py``.

Every code path of the kernel (one chunk / chunked, even / ragged ``N``, persistent / one row block
per block, ``ROWS`` > remaining rows, latency hint, 8 worker warps) against
``torch.nn.functional.layer_norm`` in fp32, on small problems (a few dozen compiles).
"""

from __future__ import annotations

import pytest


torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ct = pytest.importorskip("cuda.tile")

from tiletune.lab.examples.layernorm_kernels import (  # noqa: E402
    LAYERNORM_BASELINE,
    layernorm_args,
    layernorm_grid,
    layernorm_hints,
    layernorm_kernel,
    layernorm_reference,
    layernorm_tile_n,
)

CONFIGS = [
    dict(LAYERNORM_BASELINE),
    dict(PERSISTENT=False, ROWS=4, CHUNK_N=1024, LATENCY=4, occupancy=1, num_worker_warps=8),
    dict(PERSISTENT=True, ROWS=8, CHUNK_N=2048, LATENCY=0, occupancy=4, num_worker_warps=4),
    dict(PERSISTENT=True, ROWS=2, CHUNK_N=4096, LATENCY=4, occupancy=8, num_worker_warps=8),
]

TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (1e-2, 1e-2), torch.float32: (1e-3, 1e-3)}

_hinted: dict = {}


def _run(cfg, x, w, b, eps=1e-5):
    key = tuple(sorted(layernorm_hints(cfg).items()))
    k = _hinted.get(key)
    if k is None:
        k = _hinted[key] = layernorm_kernel.replace_hints(**layernorm_hints(cfg))
    y = torch.full_like(x, float("nan"))
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    ct.launch(torch.cuda.current_stream(), layernorm_grid(cfg, x.shape[0], sms), k,
              layernorm_args(cfg, x, w, b, y, eps))
    torch.cuda.synchronize()
    return y


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
@pytest.mark.parametrize("m, n, dtype", [
    (1000, 4096, torch.bfloat16),   # even; one chunk or 2-4 chunks
    (513, 3000, torch.bfloat16),    # ragged N (padding columns masked), ragged M
    (64, 8192, torch.float32),      # wide rows: chunked for every config
    (300, 1000, torch.float16),     # small N: one chunk for every config
    (7, 5000, torch.bfloat16),      # fewer rows than ROWS * blocks; chunked and ragged
])
def test_layernorm_matches_torch(cfg, m, n, dtype):
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, n, device="cuda", generator=g).to(dtype) * 3 + 1
    w = torch.randn(n, device="cuda", generator=g).to(dtype)
    b = torch.randn(n, device="cuda", generator=g).to(dtype)
    y = _run(cfg, x, w, b)
    rtol, atol = TOL[dtype]
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.float(), layernorm_reference(x, w, b, 1e-5).float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("cfg", CONFIGS[1:3], ids=["chunked1024", "chunked2048"])
def test_layernorm_large_mean_is_stable(cfg):
    """Mean 100, std 0.01 in fp32: E[x^2] - mean^2 would lose every digit; the shifted sums do not."""
    m, n = 256, 4096
    assert layernorm_tile_n(cfg, n) < n  # the chunked path
    g = torch.Generator(device="cuda").manual_seed(1)
    x = 100.0 + 0.01 * torch.randn(m, n, device="cuda", generator=g)
    w = torch.ones(n, device="cuda")
    b = torch.zeros(n, device="cuda")
    y = _run(cfg, x, w, b)
    torch.testing.assert_close(y, layernorm_reference(x, w, b, 1e-5), rtol=1e-2, atol=1e-2)
