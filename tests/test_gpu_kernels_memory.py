"""GPU tests of the memory-bound op library (run on the GPU host: ``pytest -m gpu``).

Every op is swept over shapes that include the awkward ones (N not a power of two, N = 1, M = 1,
very large M, rows longer than one tile, strided rows) in bfloat16, float16 and float32, and
compared with torch in float32. Each first call of a shape tunes against a fresh database with
short measurements, and every candidate of every space must pass the tuner's own correctness gate
(:func:`assert_every_candidate_passed`), so the sweep checks each configuration, not just winners.

``TILETUNE_GPU_QUICK=1`` keeps bfloat16 and float32 only (about half the tuning sessions).
"""

from __future__ import annotations

import os

import pytest


torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ct = pytest.importorskip("cuda.tile")

import tiletune as tt  # noqa: E402
import tiletune.kernels as K  # noqa: E402
from tiletune.kernels.library_op import LibraryOp  # noqa: E402
from tiletune.kernels.cross_entropy_op import CE_GRAD, CE_LOSS  # noqa: E402
from tiletune.kernels.glu import GEGLU, SWIGLU  # noqa: E402
from tiletune.kernels.norms import LAYER_NORM, RMS_NORM, RMS_NORM_RESIDUAL  # noqa: E402
from tiletune.kernels.rope import ROPE  # noqa: E402
from tiletune.kernels.softmax_op import SOFTMAX  # noqa: E402

F = torch.nn.functional
DEV = "cuda"
DTYPES = [torch.bfloat16, torch.float32] if os.environ.get("TILETUNE_GPU_QUICK") else \
    [torch.bfloat16, torch.float16, torch.float32]
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (1e-2, 1e-2), torch.float32: (2e-5, 2e-5)}
FAST = tt.TunerOptions(stopping=tt.StoppingRule(min_samples=3, max_samples=10, max_seconds=0.05),
                       showdown_rounds=1)

ROW_SHAPES = [
    (1, 1),           # M = 1, N = 1
    (7, 1),           # N = 1
    (1, 4096),        # M = 1
    (3, 5, 1000),     # batch dims, N not a power of two
    (333, 5120),
    (4096, 4096),
    (200_000, 128),   # very large M, short rows (many rows per tile)
    (2, 20_000),      # longer than one tile: chunked, N not a power of two
    (3, 65_536),      # chunked
]


@pytest.fixture(scope="module", autouse=True)
def fresh_database(tmp_path_factory):
    LibraryOp.configure(db=tt.TuningDB(tmp_path_factory.mktemp("tuning") / "t.db"), options=FAST, progress=False)
    yield
    LibraryOp.configure()


def assert_every_candidate_passed(*families):
    """Every candidate of every tuning session so far compiled, ran and matched the reference."""
    sessions = 0
    for fam in families:
        for op in fam.ops().values():
            for res in op.results.values():
                sessions += 1
                assert not res.failures, f"{fam.name}: {res.identity.key}\n{res.summary()}"
    assert sessions > 0


def close(got, want, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol * scale)


def rand(shape, dtype, scale=1.0):
    return (torch.randn(shape, device=DEV, dtype=torch.float32) * scale).to(dtype)


# ---------------------------------------------------------------------------------------------
# norms
# ---------------------------------------------------------------------------------------------

def rms_ref(x, w, eps):
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return out * w.float() if w is not None else out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_rms_norm(shape, dtype):
    x = rand(shape, dtype)
    w = rand(shape[-1], dtype)
    y = K.rms_norm(x, w, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype
    close(y, rms_ref(x, w, 1e-6), dtype, scale=4)
    assert_every_candidate_passed(RMS_NORM)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_and_softmax_of_narrow_rows_in_a_padded_buffer(dtype):
    """Rows of 5 elements 16 bytes apart (a view of a padded buffer): TMA stores wrote the gaps on sm_90, so
    these rows get plain stores; every candidate must leave the gaps alone (the tuner's guard bands check)."""
    x = rand((7, 8), dtype)[:, :5]
    w = rand(5, dtype)
    close(K.rms_norm(x, w, 1e-6), rms_ref(x, w, 1e-6), dtype, scale=4)
    close(K.softmax(x), torch.softmax(x.float(), -1), dtype)
    assert_every_candidate_passed(RMS_NORM, SOFTMAX)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_rows_no_weight_and_fp32_weight(dtype):
    big = rand((64, 4096), dtype)
    x = big[:, :3000]  # rows strided by 4096 elements
    close(K.rms_norm(x, None, 1e-5), rms_ref(x, None, 1e-5), dtype, scale=4)
    w32 = torch.randn(3000, device=DEV)
    close(K.rms_norm(x, w32, 1e-5), rms_ref(x, w32, 1e-5), dtype, scale=4)
    assert_every_candidate_passed(RMS_NORM)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (5, 1), (1, 8192), (3, 7, 1000), (4096, 4096), (100_000, 256),
                                   (2, 12_000), (3, 40_000)])
def test_rms_norm_residual(shape, dtype):
    x, r = rand(shape, dtype), rand(shape, dtype)
    w = rand(shape[-1], dtype)
    y, h = K.rms_norm_residual(x, r, w, 1e-6)
    h_ref = (x.float() + r.float()).to(dtype)
    assert torch.equal(h, h_ref)
    close(y, rms_ref(h_ref, w, 1e-6), dtype, scale=4)
    assert_every_candidate_passed(RMS_NORM_RESIDUAL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_layer_norm(shape, dtype):
    x = rand(shape, dtype, scale=2.0) + 3.0  # an offset mean: the variance must stay accurate
    w, b = rand(shape[-1], dtype), rand(shape[-1], dtype)
    y = K.layer_norm(x, w, b, 1e-5)
    ref = F.layer_norm(x.float(), (shape[-1],), w.float(), b.float(), 1e-5)
    close(y, ref, dtype, scale=4)
    assert_every_candidate_passed(LAYER_NORM)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_without_affine_and_strided(dtype):
    big = rand((32, 2048), dtype)
    x = big[:, 100:1100]
    close(K.layer_norm(x), F.layer_norm(x.float(), (1000,)), dtype, scale=4)
    w = rand(1000, dtype)
    close(K.layer_norm(x, w, None), F.layer_norm(x.float(), (1000,), w.float()), dtype, scale=4)
    assert_every_candidate_passed(LAYER_NORM)


# ---------------------------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES + [(16, 50_257)])
def test_softmax(shape, dtype):
    x = rand(shape, dtype, scale=4.0)
    y = K.softmax(x)
    close(y, torch.softmax(x.float(), -1), dtype)
    assert_every_candidate_passed(SOFTMAX)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_large_values_other_dim_and_strided(dtype):
    x = rand((64, 3000), dtype, scale=30.0)  # exp overflows without the max shift
    close(K.softmax(x), torch.softmax(x.float(), -1), dtype)
    close(K.softmax(x, dim=0), torch.softmax(x.float(), 0), dtype)
    big = rand((64, 4096), dtype)
    close(K.softmax(big[:, 5:1005]), torch.softmax(big[:, 5:1005].float(), -1), dtype)


# ---------------------------------------------------------------------------------------------
# gated activations
# ---------------------------------------------------------------------------------------------

GLU_SHAPES = [(1, 2), (7, 2 * 1000), (3, 5, 2 * 1000), (4096, 2 * 14_336), (100_000, 2 * 64), (1, 2 * 11_008),
              (7, 2)]  # a (7, 1) output: the shape whose TMA-allowed stores wrote past the end in the row ops


def glu_ref(x, act):
    h = x.shape[-1] // 2
    g, u = x[..., :h].float(), x[..., h:].float()
    return act(g) * u


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", GLU_SHAPES)
def test_swiglu(shape, dtype):
    x = rand(shape, dtype, scale=3.0)
    y = K.swiglu(x)
    assert y.shape == tuple(shape[:-1]) + (shape[-1] // 2,)
    close(y, glu_ref(x, F.silu), dtype, scale=4)
    assert_every_candidate_passed(SWIGLU)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", GLU_SHAPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_geglu(shape, dtype, approximate):
    x = rand(shape, dtype, scale=3.0)
    y = K.geglu(x, approximate=approximate)
    close(y, glu_ref(x, lambda g: F.gelu(g, approximate=approximate)), dtype, scale=4)
    assert_every_candidate_passed(GEGLU)


@pytest.mark.parametrize("dtype", DTYPES)
def test_glu_strided_rows(dtype):
    big = rand((64, 3 * 512), dtype)
    x = big[:, : 2 * 512]
    close(K.swiglu(x), glu_ref(x, F.silu), dtype, scale=4)


# ---------------------------------------------------------------------------------------------
# RoPE (in place)
# ---------------------------------------------------------------------------------------------

def hf_rope(x_bshd, cos, sin):
    """Hugging Face's rotate-half RoPE on the first R dims of a (B, S, H, D) float tensor."""
    r = cos.shape[-1]
    c = (cos if cos.dim() == 3 else cos[None]).float()[:, :, None, :]
    s = (sin if sin.dim() == 3 else sin[None]).float()[:, :, None, :]
    x = x_bshd.float()
    xr, rest = x[..., :r], x[..., r:]
    rot = torch.cat((-xr[..., r // 2:], xr[..., : r // 2]), dim=-1)
    return torch.cat((xr * c + rot * s, rest), dim=-1)


def trig(shape):
    ang = torch.rand(shape, device=DEV) * 6.0
    return ang.cos(), ang.sin()


ROPE_CASES = [
    # (B, S, Hq, Hk, D, R, layout, cos batch (None: 2-D cos))
    (2, 1024, 32, 8, 128, 128, "bshd", None),
    (1, 512, 32, 8, 128, 128, "bhsd", 1),
    (2, 16, 12, 12, 96, 64, "bshd", 2),   # partial rotary, per-batch cos
    (1, 7, 5, 1, 80, 80, "bshd", None),   # half dim 40 (not a power of two), MQA
    (4, 1, 32, 8, 128, 128, "bshd", None),  # decode: S = 1
    (1, 1, 1, 1, 2, 2, "bhsd", None),     # the smallest
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ROPE_CASES)
def test_rope_in_place_exactly_one_application_per_call(case, dtype):
    b, s, hq, hk, d, r, layout, cb = case
    shape_q = (b, s, hq, d) if layout == "bshd" else (b, hq, s, d)
    shape_k = (b, s, hk, d) if layout == "bshd" else (b, hk, s, d)
    q, k = rand(shape_q, dtype), rand(shape_k, dtype)
    cos, sin = trig((s, r) if cb is None else (cb, s, r))
    q0, k0 = q.clone(), k.clone()

    def bshd(t):
        return t if layout == "bshd" else t.transpose(1, 2)

    out = K.apply_rope_(q, k, cos, sin, layout=layout)  # tunes: candidates run on restored copies
    assert out[0] is q and out[1] is k
    q1 = hf_rope(bshd(q0), cos, sin).to(dtype)
    k1 = hf_rope(bshd(k0), cos, sin).to(dtype)
    close(bshd(q), q1, dtype)
    close(bshd(k), k1, dtype)
    K.apply_rope_(q, k, cos, sin, layout=layout)  # second call: the tuned kernel, one more rotation
    close(bshd(q), hf_rope(q1, cos, sin), dtype, scale=2)
    close(bshd(k), hf_rope(k1, cos, sin), dtype, scale=2)
    assert_every_candidate_passed(ROPE)


def test_rope_on_views_of_a_fused_qkv_tensor_leaves_v_alone():
    b, s, hq, hk, d = 2, 64, 16, 4, 64
    qkv = rand((b, s, hq + 2 * hk, d), torch.bfloat16)
    before = qkv.clone()
    q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]
    cos, sin = trig((s, d))
    K.apply_rope_(q, k, cos, sin)
    assert torch.equal(qkv[:, :, hq + hk:], before[:, :, hq + hk:])
    close(q, hf_rope(before[:, :, :hq], cos, sin), torch.bfloat16)
    close(k, hf_rope(before[:, :, hq:hq + hk], cos, sin), torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# cross-entropy
# ---------------------------------------------------------------------------------------------

CE_SHAPES = [(1, 1000), (7, 32_000), (64, 50_257), (512, 128_256), (3, 256_000), (2, 3, 1000)]


def ce_ref(logits, target, ignore_index=-100):
    lf = logits.float().detach().requires_grad_(True)
    loss = F.cross_entropy(lf.reshape(-1, lf.shape[-1]), target.reshape(-1).long(), ignore_index=ignore_index)
    (grad,) = torch.autograd.grad(loss, lf)
    return loss.detach(), grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CE_SHAPES)
def test_cross_entropy_loss_and_grad(shape, dtype):
    logits = rand(shape, dtype, scale=3.0)
    target = torch.randint(0, shape[-1], shape[:-1], device=DEV)
    want_loss, want_grad = ce_ref(logits, target)
    loss = K.cross_entropy(logits, target)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-4)
    loss2, grad = K.cross_entropy(logits, target, return_grad=True)
    torch.testing.assert_close(loss2, want_loss, rtol=1e-4, atol=1e-4)
    assert grad.shape == logits.shape and grad.dtype == dtype
    peak = float(want_grad.abs().max())
    torch.testing.assert_close(grad.float(), want_grad, rtol=TOL[dtype][0], atol=1e-3 * peak)
    assert_every_candidate_passed(CE_LOSS, CE_GRAD)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cross_entropy_ignore_index_and_int32_targets(dtype):
    m, v = 300, 32_000
    logits = rand((m, v), dtype, scale=2.0)
    target = torch.randint(0, v, (m,), device=DEV)
    target[::7] = -100
    want_loss, want_grad = ce_ref(logits, target)
    loss, grad = K.cross_entropy(logits, target.int(), return_grad=True)
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad.float(), want_grad, rtol=TOL[dtype][0], atol=1e-3 * float(want_grad.abs().max()))
    assert torch.all(grad[::7] == 0)
    other = torch.full_like(target, 5)
    other[:10] = 7
    want2, _ = ce_ref(logits, other, ignore_index=7)
    torch.testing.assert_close(K.cross_entropy(logits, other, ignore_index=7), want2, rtol=1e-4, atol=1e-4)
