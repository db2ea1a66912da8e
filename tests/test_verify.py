"""The correctness gate (:mod:`tiletune.devices.verify`) on CPU tensors.

Planted wrong outputs of small magnitude (softmax-like 1e-5..1e-4, norm-like) are rejected in bf16,
fp16 and fp32; honest low-precision results (float64 or float32 math rounded to the dtype, kernel-like
float32 algorithms of the library ops) pass the library ops' own tolerances; each targeted mutation of
the gate (first output only, integers never compared, 10x looser bf16, no shape check,
``rtol * (|want| + 1)``, NaN ignored) fails a test here; multi-output and integer-output ops go
through the whole tuner on the fake backend.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.records import Status
from tiletune.devices.verify import (
    DEFAULT_TOLERANCE,
    FLOAT32_TINY,
    INT_SENTINEL,
    SCRATCH,
    ArgGuard,
    Checker,
    Tolerance,
    compare_tensors,
    derived_tolerance,
    derived_tolerances,
    dtype_name,
    eps,
    exp_range,
    floor_for,
    output_tolerance,
    poison,
    tolerance_for,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from planted_bugs import BUGS, bias_of, gate_rows, plant  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SPACE = tt.Space(TM=[32, 64, 128], occupancy=[1, 2], baseline=dict(TM=64, occupancy=1))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def softmax_like(shape=(32, 512), seed=0) -> torch.Tensor:
    """float64 values spread log-uniformly over 1e-5..1e-4 (probabilities of a long row)."""
    return 10.0 ** (-5.0 + torch.rand(shape, generator=gen(seed), dtype=torch.float64))


def norm_like(shape=(32, 512), seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=gen(seed), dtype=torch.float64)


def real_softmax(shape=(32, 512), scale=3.0, seed=0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen(seed), dtype=torch.float64) * scale).softmax(-1)


DATA = {"softmax_like": softmax_like, "norm_like": norm_like, "softmax": real_softmax}


# ---------------------------------------------------------------------------------------------
# the rule
# ---------------------------------------------------------------------------------------------

def test_defaults_are_multiples_of_the_dtype_epsilon():
    for name in ("bfloat16", "float16", "float32"):
        t = DEFAULT_TOLERANCE[name]
        e = eps(name)
        assert t == tolerance_for(getattr(torch, name))
        # two ulps relative, one ulp of the RMS, one ulp aggregate, plus 20 float32 ulps of computation
        assert t.rtol == pytest.approx(2 * e + 20 * eps("float32"))
        assert t.atol_rms == pytest.approx(e + 20 * eps("float32"))
        assert t.agg == pytest.approx(e + 20 * eps("float32"))
        assert t.atol == 0.0 and t.agg_atol == 0.0
    assert DEFAULT_TOLERANCE["bfloat16"].rtol < 0.016  # no 2e-2 absolute or relative slack any more
    assert tolerance_for(torch.int32) == Tolerance(0.0, 0.0, 0.0, 0.0, 0.0)
    assert eps(torch.bfloat16) == 2 ** -7 and eps("tfloat32") == 2 ** -10 and eps(torch.int64) == 0.0
    assert dtype_name(torch.float16) == "float16"


def test_derived_tolerance_grows_with_length_and_exp_range():
    short = derived_tolerance("float32", length=16)
    long = derived_tolerance("float32", length=4096)
    assert long.rtol - short.rtol == pytest.approx(4 * (64 - 4) * eps("float32"))
    wide = derived_tolerance("float32", length=16, exp_range=10)
    assert wide.rtol - short.rtol == pytest.approx(20 * eps("float32"))
    # for 16-bit outputs the float32 terms are small next to the output's own rounding
    assert derived_tolerance("bfloat16", length=4096).rtol < 2.05 * eps("bfloat16")
    assert derived_tolerance("float64").rtol == pytest.approx(2 * eps("float64") + 20 * eps("float64"))
    assert set(derived_tolerances()) == {"float32", "float16", "bfloat16"}


def test_exp_range_ignores_non_finite_values():
    x = torch.tensor([[0.0, 3.0, -float("inf")], [1.0, 1.0, 1.0], [-float("inf")] * 3])
    assert exp_range(x) == 3.0
    assert exp_range(torch.tensor([[0.0, 1000.0]])) == 128.0


def test_legacy_pairs_keep_their_meaning():
    t = tolerance_for(torch.float32, {"float32": (0.0, 0.02)})
    assert t == Tolerance(0.0, 0.02, 0.0, DEFAULT_TOLERANCE["float32"].agg, 0.02)
    want = torch.randn(64, generator=gen(1)) * 2
    assert compare_tensors(want + 0.01, want, {"float32": (0.0, 0.02)}) is None
    assert compare_tensors(want + 0.03, want, {"float32": (0.0, 0.02)}) is not None
    loose = tolerance_for(torch.bfloat16, {"bfloat16": (0.1, 0.0)})
    assert loose.agg == 0.1  # never tighter than rtol
    t = tolerance_for(torch.float16, {"float16": Tolerance(1e-3)})
    assert t.agg == max(DEFAULT_TOLERANCE["float16"].agg, 1e-3) and t.agg_atol == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_shape_kind_and_exactness(dtype):
    want = norm_like((4, 8)).to(dtype)
    assert "shape" in compare_tensors(want.t().contiguous(), want)
    assert "shape" in compare_tensors(want, want[0])  # broadcastable is not equal
    assert "shape" in compare_tensors(want[:, :1], want)
    assert "dtype" in compare_tensors(want, torch.ones(4, 8, dtype=torch.int64))
    assert "dtype" in compare_tensors(torch.ones(4, 8, dtype=torch.int32), want)
    assert "dtype" in compare_tensors(torch.ones(4, 8, dtype=torch.bool), torch.ones(4, 8, dtype=torch.int32))
    assert compare_tensors(want.clone(), want) is None
    assert compare_tensors(want.clone(), want.double()) is None  # a float64 reference is fine
    assert compare_tensors(want[:0], want[:0]) is None


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_outputs_are_compared_exactly(dtype):
    want = torch.arange(100, dtype=dtype) % 7
    assert compare_tensors(want.clone(), want) is None
    got = want.clone()
    got[63] += 1
    reason = compare_tensors(got, want)
    assert reason is not None and "1 of 100" in reason and "exact" in reason
    assert compare_tensors(got, want, {dtype_name(dtype): (1.0, 10.0)}) is not None  # no tolerance for ints


def test_bool_outputs_are_compared_exactly():
    want = torch.arange(10) % 3 == 0
    got = want.clone()
    got[1] = ~got[1]
    assert compare_tensors(got, want) is not None and compare_tensors(want.clone(), want) is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf(dtype):
    want = norm_like((8, 16)).to(dtype)
    got = want.clone()
    got[3, 5] = float("nan")
    reason = compare_tensors(got, want)
    assert reason is not None and "NaN" in reason and "1 of 128" in reason
    poisoned = want.clone()
    poison(poisoned)
    assert "128 of 128" in compare_tensors(poisoned, want)
    w2 = want.clone()
    w2[0, 0] = float("nan")
    assert compare_tensors(w2.clone(), w2) is None  # NaN expected and produced
    assert "NaN" in compare_tensors(want.clone(), w2)  # NaN expected, a number produced
    w2[0, 0] = float("inf")
    assert compare_tensors(w2.clone(), w2) is None
    g2 = w2.clone()
    g2[0, 0] = -float("inf")
    assert "Inf" in compare_tensors(g2, w2)
    g2[0, 0] = 1.0
    assert "Inf" in compare_tensors(g2, w2)
    g3 = want.clone()
    g3[1, 1] = float("inf")
    assert "Inf" in compare_tensors(g3, want)
    # a finite reference beyond the dtype's range rounds to inf: a kernel that rounds does too
    if dtype == torch.float16:
        big = torch.tensor([1e6], dtype=torch.float32)
        assert compare_tensors(torch.tensor([float("inf")], dtype=dtype), big) is None


def test_nan_is_never_within_tolerance_even_with_huge_bounds():
    want = torch.ones(1000)
    got = want.clone()
    got[7] = float("nan")
    assert compare_tensors(got, want, {"float32": Tolerance(1e9, 1e9, 1e9, 1e9, 1e9)}) is not None


def test_rtol_is_relative_to_want_not_want_plus_one():
    """One small element off by 50x its rtol: only ``rtol * |want|`` (not ``rtol * (|want| + 1)``) sees it."""
    want = torch.full((10_000,), 1e-2)
    want[17] = 1e-4
    got = want.clone()
    got[17] += 5e-3
    tol = {"float32": Tolerance(rtol=0.0156, atol=0.0, atol_rms=0.0, agg=0.0078, agg_atol=0.0)}
    reason = compare_tensors(got, want, tol)
    assert reason is not None and reason.startswith("elementwise")


def test_bf16_tolerance_is_not_ten_times_looser():
    """Every bf16 element off by 4 ulps relative: rejected (the gate allows 2 ulps, 10x looser would pass)."""
    want = norm_like((64, 64)).to(torch.bfloat16)
    got = (want.double() * (1 + 4 * eps(torch.bfloat16))).to(torch.bfloat16)
    assert compare_tensors(got, want) is not None
    near = (want.double() * (1 + 1.0 * eps(torch.bfloat16))).to(torch.bfloat16)  # 1 ulp: the rounding itself
    assert compare_tensors(near, want) is None


def test_aggregate_catches_errors_each_within_the_elementwise_bound():
    want = norm_like((64, 256)).to(torch.float32)
    t = DEFAULT_TOLERANCE["float32"]
    rms = float(want.pow(2).mean().sqrt())
    got = want + 0.9 * (t.atol_rms * rms + t.rtol * want.abs())  # each element just inside
    reason = compare_tensors(got, want)
    assert reason is not None and reason.startswith("aggregate") and "normalized error" in reason


def test_reason_names_the_measure_value_and_bound():
    want = softmax_like().to(torch.bfloat16)
    got = plant("dropped_small", want)
    reason = compare_tensors(got, want)
    assert reason.startswith("elementwise") and " > bound " in reason and "rtol" in reason and "rms(want)" in reason


# ---------------------------------------------------------------------------------------------
# planted bugs (the functions of benchmarks/planted_bugs.py) on small-magnitude outputs
# ---------------------------------------------------------------------------------------------

def _op_tolerances(kind: str, n: int, x=None):
    norms = importlib.import_module("tiletune.kernels.norms")
    softmax = importlib.import_module("tiletune.kernels.softmax_op")

    if kind == "softmax":  # peaky rows: only a tolerance without RMS-tied slack sees dropped tiny values
        return {"softmax": importlib.import_module("tiletune.kernels.softmax_op").softmax_tolerance(
            torch.randn(4, n) * 3 if x is None else x, None)}
    out = {"default": None, "rms_norm": norms._norm_tolerance(torch.empty(1, n)),
           "layer_norm": norms._layer_norm_tolerance(torch.empty(1, n))}
    if kind != "norm_like":
        out["softmax"] = softmax.softmax_tolerance(torch.randn(4, n) * 3 if x is None else x, None)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(DATA))
@pytest.mark.parametrize("bug", BUGS)
def test_planted_bug_is_rejected(bug, kind, dtype):
    want = DATA[kind]().to(dtype)
    previous = DATA[kind](seed=1).to(dtype)
    got = plant(bug, want, previous)
    assert got.shape == want.shape and got.dtype == want.dtype and not torch.equal(got, want)
    for name, tol in _op_tolerances(kind, want.shape[-1]).items():
        assert compare_tensors(got, want, tol) is not None, (bug, kind, dtype, name)


def test_plant_shapes_and_amounts():
    want = torch.arange(1.0, 17.0).reshape(2, 8)
    assert plant("zeroed_tail", want)[:, -1].eq(0).all() and plant("zeroed_tail", want)[:, :-1].ne(0).all()
    assert torch.equal(plant("off_by_one_row", want), want.roll(1, 0))
    assert torch.equal(plant("stale_row", want)[1], want[0])
    assert int(plant("dropped_small", want).eq(0).sum()) == 1  # 10% of 16 elements -> the smallest one
    assert torch.equal(plant("off_by_one_row", want[0]), want[0].roll(1))  # one row: elements shift
    assert plant("stale_row", want[0]).eq(1).all()
    assert bias_of(want.bfloat16()) == 4 * 2 ** -7 * 16 and bias_of(want) == 4 * 2 ** -10 * 16
    assert torch.equal(plant("stale_previous", want, want * 3), want * 3)
    with pytest.raises(ValueError):
        plant("stale_previous", want)
    with pytest.raises(ValueError):
        plant("nonsense", want)


# ---------------------------------------------------------------------------------------------
# honest low-precision results pass (tolerances derived from float64 vs low-precision math)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(DATA))
def test_rounded_float64_and_float32_results_pass(kind, dtype):
    exact = DATA[kind]((64, 1024))
    ref = exact.float().to(dtype)  # float32 math rounded (the library references' way)
    assert compare_tensors(exact.to(dtype), ref) is None  # exact result rounded once
    assert compare_tensors(exact.to(dtype), exact) is None  # against the float64 reference itself
    assert compare_tensors(exact.float().to(dtype), exact) is None
    # one ulp flips where an fp32 computation lands on the other side of a rounding boundary
    e32 = (exact * (1 + 2 * eps("float32") * torch.randn(exact.shape, generator=gen(3), dtype=torch.float64)))
    assert compare_tensors(e32.float().to(dtype), ref) is None


def _chunked_sum(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """float32 row sums the way the kernels do: per-chunk tree sums added in sequence."""
    acc = torch.zeros(x.shape[:-1] + (1,), dtype=torch.float32)
    for c in range(0, x.shape[-1], chunk):
        acc = acc + x[..., c:c + chunk].sum(-1, keepdim=True, dtype=torch.float32)
    return acc


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_like_rms_norm_and_layer_norm_pass_their_tolerances(dtype):
    norms = importlib.import_module("tiletune.kernels.norms")

    n = 3000
    x = (torch.randn(64, n, generator=gen(4)) * 2 + 0.5).to(dtype)
    w = torch.randn(n, generator=gen(5)).to(dtype)
    b = torch.randn(n, generator=gen(6)).to(dtype)
    y = torch.empty_like(x)
    xf = x.float()
    rstd = torch.rsqrt(_chunked_sum(xf * xf, 256) * (1.0 / n) + 1e-6)
    got = (xf * rstd * w.float()).to(dtype)
    want = norms.rms_norm_reference(x, w, y, 1e-6, True)
    tol = norms._norm_tolerance(x, w, y)
    assert compare_tensors(got, want, tol) is None
    exact = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert compare_tensors(exact.to(dtype), want, tol) is None
    # layer norm: chunked mean/M2 merge as in the kernel
    mean = _chunked_sum(xf, 512) / n
    d = xf - mean
    var = _chunked_sum(d * d, 512) / n
    got = (d * torch.rsqrt(var + 1e-5) * w.float() + b.float()).to(dtype)
    want = norms.layer_norm_reference(x, w, b, y, 1e-5, True, True)
    ltol = norms._layer_norm_tolerance(x, w, b, y)
    assert compare_tensors(got, want, ltol) is None
    xd = x.double()
    exact = torch.nn.functional.layer_norm(xd, (n,), w.double(), b.double(), 1e-5)
    assert compare_tensors(exact.to(dtype), want, ltol) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_kernel_like_softmax_and_cross_entropy_pass_their_tolerances(dtype, scale):
    ce = importlib.import_module("tiletune.kernels.cross_entropy_op")
    softmax = importlib.import_module("tiletune.kernels.softmax_op")

    log2e = 1.4426950408889634
    x = (torch.randn(32, 5000, generator=gen(7)) * scale).to(dtype)
    xf = x.float()
    m = xf.amax(-1, keepdim=True)
    e = torch.exp2((xf - m) * log2e)
    got = (e * (1.0 / _chunked_sum(e, 1024))).to(dtype)
    want = softmax.softmax_reference(x, got)
    tol = softmax.softmax_tolerance(x, got)
    assert compare_tensors(got, want, tol) is None
    assert compare_tensors(x.double().softmax(-1).to(dtype), want, tol) is None
    # cross-entropy: the mean loss (float32, summed per block then over blocks) and gradient (logits'
    # dtype), kernel-like
    target = torch.randint(0, 5000, (32,), generator=gen(8))
    target[3] = -100
    lse = m + torch.log(_chunked_sum(e, 1024))
    valid = target != -100
    inv = 1.0 / valid.sum().float()
    scale_r = torch.where(valid, inv, torch.zeros(())).unsqueeze(1)
    tl = xf.gather(1, target.clamp(min=0).unsqueeze(1))
    rows = ((lse - tl) * scale_r).reshape(-1)
    loss = torch.stack([rows[b::5].sum() for b in range(5)]).sum().reshape(1)  # 5 blocks
    p = torch.exp2((xf - lse) * log2e) * scale_r
    onehot = torch.zeros_like(p).scatter_(1, target.clamp(min=0).unsqueeze(1), 1.0)
    grad = (p - onehot * scale_r).to(dtype)
    out, part, sem = torch.empty(1), torch.empty(1024), torch.zeros(1, dtype=torch.int32)
    want_loss, want_grad, _, want_sem = ce.cross_entropy_grad_reference(x, target, out, grad, part, sem, -100)
    assert want_sem.shape == (1,) and int(want_sem) == 0
    ctol = ce._tolerance(x, target, out, grad, part, sem, -100)
    assert compare_tensors(loss, want_loss, ctol["output:0"]) is None
    assert compare_tensors(grad, want_grad, ctol) is None
    if scale == 1.0 and dtype != torch.float16:  # (fp16 grads of 1/(32*5000) underflow to zero)
        # a gradient with the small probabilities dropped, a loss with a small bias, are not
        assert compare_tensors(plant("dropped_small", want_grad), want_grad, ctol) is not None
        assert compare_tensors(plant("eps_bias", want_loss), want_loss, ctol["output:0"]) is not None


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_like_gated_activations_and_rope_pass_their_tolerances(dtype):
    glu = importlib.import_module("tiletune.kernels.glu")
    rope = importlib.import_module("tiletune.kernels.rope")

    g = (torch.randn(64, 512, generator=gen(9)) * 2.5).to(dtype)
    u = (torch.randn(64, 512, generator=gen(10)) * 2.5).to(dtype)
    y = torch.empty_like(g)
    gf, uf = g.float(), u.float()
    # the kernel's erf: Abramowitz-Stegun 7.1.26 (absolute error 1.5e-7)
    z = gf.abs() * 0.7071067811865476
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    erf_abs = 1.0 - poly * torch.exp(-z * z)
    got = (0.5 * gf * (1.0 + torch.where(gf < 0, -erf_abs, erf_abs)) * uf).to(dtype)
    tol = glu.glu_tolerance(g, u, y, 2)
    assert compare_tensors(got, glu.glu_reference(g, u, y, 2), tol) is None
    got = (gf * torch.sigmoid(gf) * uf).to(dtype)
    assert compare_tensors(got, glu.glu_reference(g, u, y, glu.ACT_SILU), tol) is None
    # rope: x1 * c - x2 * s with the products fused (float64 here) or not
    x1, x2 = g[:, :256], g[:, 256:]
    c, s = torch.cos(uf[:, :256]).to(dtype), torch.sin(uf[:, :256]).to(dtype)
    fused = (x1.double() * c.double() - x2.double() * s.double()).to(dtype)
    plain = (x1.float() * c.float() - x2.float() * s.float()).to(dtype)
    assert compare_tensors(fused, plain, rope.rope_tolerance()) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_like_matmul_and_attention_pass_their_tolerances(dtype):
    att = importlib.import_module("tiletune.kernels.attention_op")
    gemm = importlib.import_module("tiletune.kernels.gemm")
    simple_matmul = importlib.import_module("tiletune.lab.examples.simple_matmul")
    from tiletune.kernels.attention_kernels import attention_reference

    a = torch.randn(1, 96, 2048, generator=gen(11)).to(dtype)
    b = torch.randn(1, 2048, 80, generator=gen(12)).to(dtype)
    c = torch.empty(1, 96, 80, dtype=dtype)
    one = torch.ones(1)
    want = gemm._reference(a, b, c, one, one, False, False, False)
    got = torch.zeros(1, 96, 80)
    for k0 in range(0, 2048, 64):  # float32 accumulation tile by tile
        got = got + a[..., k0:k0 + 64].float() @ b[:, k0:k0 + 64].float()
    tol = gemm._tolerance(a, b, c, one, one, False)
    assert compare_tensors(got.to(dtype), want, tol) is None
    assert compare_tensors(got.to(dtype)[0], want[0], simple_matmul._tolerance(a[0], b[0], c[0])) is None
    assert compare_tensors(plant("dropped_small", want), want, tol) is not None
    # attention, causal: probabilities rounded to the input dtype before P @ V, as in the kernel
    q = torch.randn(1, 4, 256, 64, generator=gen(13)).to(dtype)
    k = torch.randn(1, 2, 256, 64, generator=gen(14)).to(dtype)
    v = torch.randn(1, 2, 256, 64, generator=gen(15)).to(dtype)
    want = attention_reference(q, k, v, True)
    kk, vv = k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1)
    s = q.float() @ kk.transpose(-1, -2) / 8.0
    s = s.masked_fill(~torch.ones(256, 256, dtype=torch.bool).tril(), -float("inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    got = ((p.to(dtype).float() @ vv) / p.sum(-1, keepdim=True)).to(dtype)
    atol = att._tolerance(q, k, v, torch.empty_like(q), True, 1.0)
    assert compare_tensors(got, want, atol) is None
    for bug in BUGS:
        assert compare_tensors(plant(bug, want, got.flip(2)), want, atol) is not None, bug


def test_tf32_tolerance_passes_tf32_and_rejects_a_bias():
    gemm = importlib.import_module("tiletune.kernels.gemm")

    a = torch.randn(1, 128, 4096, generator=gen(16))
    b = torch.randn(1, 4096, 96, generator=gen(17))
    c = torch.empty(1, 128, 96)
    one = torch.ones(1)
    want = gemm._reference(a, b, c, one, one, False, False, False)

    def tf32(t):  # round to 10 mantissa bits
        m, ex = torch.frexp(t)
        return torch.ldexp(torch.round(m * 2 ** 11) / 2 ** 11, ex)

    got = tf32(a) @ tf32(b)
    tol = gemm._tf32_tolerance(a, b, c, one, one, False)
    assert compare_tensors(got, want, tol) is None
    assert compare_tensors(got + 4 * eps("tfloat32") * float(want.abs().max()), want, tol) is not None
    assert compare_tensors(plant("dropped_small", want), want, tol) is not None


# ---------------------------------------------------------------------------------------------
# the Checker: every output, named in the reason
# ---------------------------------------------------------------------------------------------

def test_checker_compares_every_output_and_names_it():
    x = torch.randn(8, 16, generator=gen(18))
    y1, y2 = torch.empty(8, 16), torch.empty(8, 16)
    args = (x, y1, y2)
    guard = ArgGuard(args, outputs=(1, 2))
    checker = Checker(lambda x, a, b: (x * 2, x.softmax(-1)), guard)
    guard.prepare_checked_run()
    y1.copy_(x * 2)
    y2.copy_(plant("dropped_small", x.softmax(-1)))
    reason = checker.compare()
    assert reason is not None and reason.startswith("output 1 (argument 2): elementwise")
    y1.copy_(x * 3)
    reason = checker.compare()
    assert "output 0 (argument 1)" in reason and "output 1 (argument 2)" in reason
    y1.copy_(x * 2)
    y2.copy_(x.softmax(-1))
    assert checker.compare() is None


def test_checker_does_not_compare_scratch_but_fails_new_non_finite_values_in_it():
    x = torch.randn(8, 16, generator=gen(19))
    y, scratch, out_scratch = torch.empty(8, 16), torch.zeros(32), torch.empty(4)
    guard = ArgGuard((x, y, scratch, out_scratch), outputs=(1, 3), inplace=(2,))
    checker = Checker(lambda x, y, s, o: (x * 2, SCRATCH, SCRATCH), guard)
    guard.prepare_checked_run()
    y.copy_(x * 2)
    scratch.normal_().mul_(1e30)  # partial sums: any finite values, whatever their size
    assert checker.compare() is None  # the scratch output is still NaN-poisoned: it had no content before
    y.copy_(x * 3)  # the compared output still fails, and is the one named
    assert checker.compare().startswith("output 0 (argument 1)")
    y.copy_(x * 2)
    scratch[5] = float("nan")  # a NaN the launch put into in-place scratch is a bug
    reason = checker.compare()
    assert reason.startswith("output 2 (argument 2): scratch: 1 NaN") and "argument 3" not in reason
    scratch[5] = float("inf")  # and so is an infinity
    assert checker.compare().startswith("output 2 (argument 2): scratch: 1 NaN or infinite")
    guard.restore()
    assert float(scratch.abs().sum()) == 0.0  # saved and restored like any written argument
    assert repr(SCRATCH) == "tiletune.devices.verify.SCRATCH"


# ---------------------------------------------------------------------------------------------
# through the tuner (fake backend): wrong second outputs and wrong integer outputs fail
# ---------------------------------------------------------------------------------------------

def _model(cfg) -> float:
    return 100.0 - 0.2 * cfg.TM - 5.0 * (cfg.occupancy - 1)  # TM=128, occupancy=2 fastest


def test_wrong_second_output_fails_the_candidate():
    def good(x, y, p):
        y.copy_(x * 2)
        p.copy_(x.softmax(-1))

    def bad_small(x, y, p):  # second output: the small probabilities dropped
        y.copy_(x * 2)
        p.copy_(plant("dropped_small", x.softmax(-1)))

    def bad_tail(x, y, p):
        y.copy_(x * 2)
        p.copy_(plant("zeroed_tail", x.softmax(-1)))

    @tt.autotune(SPACE, reference=lambda x, y, p: (x * 2, x.softmax(-1)), writes=["y", "p"], db=False,
                 progress=False, backend=FakeBackend(_model, noise=0.002))
    def op(cfg, x, y, p):
        k = {(128, 2): bad_small, (128, 1): bad_tail}.get((cfg.TM, cfg.occupancy), good)
        return tt.Launch(k, (1,), (x, y, p))

    x = torch.randn(16, 4096, generator=gen(19)) * 3
    y, p = torch.empty_like(x), torch.empty_like(x)
    op(x, y, p)
    (res,) = op.results.values()
    bad = {(m.config["TM"], m.config["occupancy"]): m for m in res.measurements if m.status is Status.MISMATCH}
    assert set(bad) == {(128, 2), (128, 1)}
    assert all("output 1 (argument 2)" in m.reason for m in bad.values())
    assert (res.winner["TM"], res.winner["occupancy"]) not in bad
    torch.testing.assert_close(p, x.softmax(-1), rtol=0, atol=0)


def test_wrong_integer_output_fails_the_candidate():
    def good(x, idx):
        idx.copy_(x.argmax(-1))

    def off_by_one(x, idx):
        idx.copy_(x.argmax(-1))
        idx[5] += 1

    @tt.autotune(SPACE, reference=lambda x, idx: x.argmax(-1), writes=["idx"], db=False, progress=False,
                 backend=FakeBackend(_model, noise=0.002), tolerance={"int64": (1.0, 10.0)})
    def op(cfg, x, idx):
        return tt.Launch(off_by_one if cfg.TM == 128 else good, (1,), (x, idx))

    x = torch.randn(32, 100, generator=gen(20))
    idx = torch.empty(32, dtype=torch.int64)
    op(x, idx)
    (res,) = op.results.values()
    bad = {m.config["TM"] for m in res.measurements if m.status is Status.MISMATCH}
    assert bad == {128} and res.winner["TM"] != 128
    assert torch.equal(idx, x.argmax(-1))


def test_benchmark_gate_path_on_the_fake_backend():
    """``gate_rows`` of the GPU benchmark, run on CPU: every planted bug is rejected, the real output
    passes, and no real config failed."""

    def kernel(x, y, h):
        y.copy_(x.softmax(-1).to(y.dtype))
        h.copy_((x * 2).to(h.dtype))

    @tt.autotune(SPACE, reference=lambda x, y, h: (x.float().softmax(-1).to(y.dtype), (x.float() * 2).to(h.dtype)),
                 writes=["y", "h"], db=False, progress=False, backend=FakeBackend(_model, noise=0.002),
                 tolerance=lambda x, y, h: importlib.import_module("tiletune.kernels.softmax_op").softmax_tolerance(x, y))
    def op(cfg, x, y, h):
        return tt.Launch(kernel, (1,), (x, y, h))

    def make_args(seed):
        x = (torch.randn(64, 512, generator=gen(30 + seed)) * 3).to(torch.bfloat16)
        return (x, torch.empty_like(x), torch.empty_like(x))

    rows, real = gate_rows("fake", op, make_args, ("y", "h"))
    assert real["candidates"] == SPACE.size() and real["mismatches"] == 0
    assert [r["rejected"] for r in rows if r["bug"] == "none"] == [False]
    planted = [r for r in rows if r["bug"] != "none"]
    assert len(planted) == 2 * len(BUGS) and all(r["rejected"] for r in planted), [
        (r["op"], r["bug"]) for r in planted if not r["rejected"]]
    assert {r["op"] for r in planted} == {"fake", "fake[h]"}


# ---------------------------------------------------------------------------------------------
# exact values and boundaries (issue 21, item 2: what mutation testing found unpinned)
# ---------------------------------------------------------------------------------------------

def test_derived_tolerance_exact_values():
    """The documented formula, to the bit: ``rtol = ulps*e + c``, ``atol_rms = atol_ulps*e + c``,
    ``agg = agg_ulps*e + c`` with ``c = (compute_ulps + 4 sqrt(max(1, length)) + 2 exp_range) * ec``."""
    e32, e16, e64 = 2.0 ** -23, 2.0 ** -10, 2.0 ** -52
    c = 20 * e32  # defaults: 16 compute ulps + 4 sqrt(1)
    assert derived_tolerance("float32") == Tolerance(2 * e32 + c, 0.0, e32 + c, e32 + c, 0.0)
    assert derived_tolerance(torch.float16) == Tolerance(2 * e16 + c, 0.0, e16 + c, e16 + c, 0.0)
    # a length below one counts as one term
    assert derived_tolerance("float32", length=0) == derived_tolerance("float32", length=1)
    c = (16 + 4 * 8 + 2 * 3) * e32
    assert derived_tolerance("float32", length=64, exp_range=3) == Tolerance(2 * e32 + c, 0.0, e32 + c, e32 + c, 0.0)
    # every knob on its own
    t = derived_tolerance("float16", length=4, ulps=3, atol_ulps=5, agg_ulps=7, compute_ulps=1)
    c = (1 + 4 * 2) * e32
    assert t == Tolerance(3 * e16 + c, 0.0, 5 * e16 + c, 7 * e16 + c, 0.0)
    # float64 is wider than the float32 compute: its own epsilon for both
    assert derived_tolerance("float64") == Tolerance(22 * e64, 0.0, 21 * e64, 21 * e64, 0.0)
    # atol_ulps=0: no slack tied to the output's RMS at all (not even the compute term)
    assert derived_tolerance("float32", atol_ulps=0).atol_rms == 0.0
    assert derived_tolerance("bfloat16", atol_ulps=0, length=4096).atol_rms == 0.0
    # non-float dtypes: exact
    for d in (torch.int32, torch.bool, "int64"):
        t = derived_tolerance(d)
        assert t == Tolerance(0.0, 0.0, 0.0, 0.0, 0.0) and all(type(v) is float for v in t)
    assert derived_tolerances(("int8", "float32"))["int8"] == Tolerance(0.0, 0.0, 0.0, 0.0, 0.0)


def test_exp_range_per_row_spread():
    assert exp_range(torch.empty(3, 0)) == 0.0 and exp_range(torch.empty(0, 5)) == 0.0
    assert exp_range(torch.tensor([[1.0, 4.0], [10.0, 11.0]])) == 3.0  # per row, not max - min overall
    assert exp_range(torch.tensor([2.0, -1.5, 0.5])) == 3.5  # one row
    x = torch.tensor([[[0.0, 1.0], [5.0, 6.0]], [[2.0, 2.5], [7.0, 7.0]]])
    assert exp_range(x) == 1.0  # the last dimension of a 3-d tensor
    assert exp_range(x.transpose(1, 2)) == 5.0
    # rows below one unit of spread, and rows without a finite value count as no spread
    assert exp_range(torch.tensor([[0.0, 0.5], [-float("inf"), -float("inf")], [float("nan"), float("inf")]])) == 0.5
    assert exp_range(torch.tensor([[float("nan")] * 4])) == 0.0
    # identical values beyond float32's range: no spread
    assert exp_range(torch.tensor([[1e300, 1e300, 1e300]], dtype=torch.float64)) == 0.0
    for dtype in DTYPES + [torch.float64]:
        assert exp_range(torch.tensor([[0.0, 3.0, -float("inf")]], dtype=dtype)) == 3.0
    assert exp_range(torch.tensor([[0.0, 40.0]]), cap=16.0) == 16.0


def test_tolerance_for_lists_and_malformed_tuples():
    d32 = DEFAULT_TOLERANCE["float32"]
    # a Tolerance sent as a list (e.g. from JSON): None fields take their defaults
    t = tolerance_for(torch.float32, {"float32": [1e-3, 1e-4, 1e-2, None, None]})
    assert t == Tolerance(1e-3, 1e-4, 1e-2, max(d32.agg, 1e-3), 1e-4)
    t = tolerance_for(torch.float32, {"float32": [1e-3, 1e-4, 1e-2]})  # three fields: not a pair
    assert t == Tolerance(1e-3, 1e-4, 1e-2, max(d32.agg, 1e-3), 1e-4)
    t = tolerance_for(torch.float32, {"float32": (1e-3, 1e-4, 0.0, 0.5, 0.25)})
    assert t == Tolerance(1e-3, 1e-4, 0.0, 0.5, 0.25)
    # a tiny rtol does not make the aggregate tighter than the dtype's default
    assert tolerance_for(torch.float32, {"float32": Tolerance(1e-9)}).agg == d32.agg
    assert tolerance_for(torch.float32, {"float32": (1e-9, 0.0)}).agg == d32.agg
    # a dtype without default (all zero): the aggregate is rtol itself
    assert tolerance_for(torch.int32, {"int32": (0.25, 0.5)}) == Tolerance(0.25, 0.5, 0.0, 0.25, 0.5)
    assert tolerance_for(torch.int32, {"int32": Tolerance(0.25)}) == Tolerance(0.25, 0.0, 0.0, 0.25, 0.0)
    # one value: rtol alone, as Tolerance(rtol)
    assert tolerance_for(torch.float32, {"float32": [1e-3]}) == Tolerance(1e-3, 0.0, 0.0, max(d32.agg, 1e-3), 0.0)
    # malformed: no value, too many, not numbers
    for bad in ((), (1, 2, 3, 4, 5, 6), ("a", 0.0)):
        with pytest.raises((TypeError, ValueError)):
            tolerance_for(torch.float32, {"float32": bad})


def test_output_tolerance_picks_the_outputs_own_mapping():
    own = {"float32": (0.5, 0.0)}
    tol = {"float32": (1e-3, 0.0), "output:1": own}
    assert output_tolerance(tol, 1) is own
    assert output_tolerance(tol, 0) is tol and output_tolerance(tol, 2) is tol
    assert output_tolerance(None, 0) is None and output_tolerance({}, 3) == {}


def test_floor_per_dtype():
    assert floor_for(torch.float64) == 2.0 ** -1074  # float64 has no flush-to-zero slack
    assert floor_for(torch.float32) == FLOAT32_TINY == 2.0 ** -126
    assert floor_for(torch.bfloat16) == FLOAT32_TINY
    assert floor_for(torch.float16) == 2.0 ** -24  # its subnormal step is larger than float32's tiny
    assert floor_for("tfloat32") == FLOAT32_TINY  # no subnormal entry: float32 flush-to-zero
    # through the comparison: a float32 output may flush a tiny reference to zero, float64 may not
    tiny = torch.full((16,), 2.0 ** -127, dtype=torch.float64)
    assert compare_tensors(torch.zeros(16), tiny) is None
    assert compare_tensors(torch.zeros(16, dtype=torch.float64), tiny) is not None
    assert compare_tensors(torch.full((16,), 1e-300, dtype=torch.float64), torch.zeros(16, dtype=torch.float64)) is not None


def test_poison_fills_every_kind():
    f = torch.zeros(4, dtype=torch.bfloat16)
    poison(f)
    assert f.isnan().all()
    i = torch.zeros(4, dtype=torch.int32)
    poison(i)
    assert i.eq(INT_SENTINEL).all()
    b = torch.zeros(4, dtype=torch.bool)
    poison(b)
    assert b.all()
    u = torch.zeros(4, dtype=torch.int64)
    poison(u)
    assert u.eq(INT_SENTINEL).all()


def test_poisoned_bool_output_fails_where_false_is_expected():
    want = torch.tensor([True, False, True])
    got = torch.empty(3, dtype=torch.bool)
    poison(got)
    assert compare_tensors(got, want) == "exact: 1 of 3 elements differ (integer/bool output, bound 0)"


def test_kind_mismatch_reason_names_both_dtypes_and_kinds():
    i, b, f = torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.bool), torch.ones(3)
    assert compare_tensors(i, f) == "dtype int32 (int) but the reference is float32 (float)"
    assert compare_tensors(f, i) == "dtype float32 (float) but the reference is int32 (int)"
    assert compare_tensors(i, b) == "dtype int32 (int) but the reference is bool (bool)"
    assert compare_tensors(b, i) == "dtype bool (bool) but the reference is int32 (int)"
    assert compare_tensors(i, torch.ones(3, dtype=torch.int64)) is None  # any integer dtype is "int"


def test_integer_reference_is_compared_as_the_output_dtype_holds_it():
    want = torch.tensor([-1, 3, 300], dtype=torch.int64)
    got = want.to(torch.uint8)  # 255, 3, 44: what a kernel writing uint8 stores
    assert compare_tensors(got, want) is None
    got[0] = 0
    assert compare_tensors(got, want) == "exact: 1 of 3 elements differ (integer/bool output, bound 0)"


def test_one_element_output_is_compared():
    assert compare_tensors(torch.tensor([1.0]), torch.tensor([1.0])) is None
    assert compare_tensors(torch.tensor([2.0]), torch.tensor([1.0])).startswith("elementwise: 1 of 1")
    assert compare_tensors(torch.tensor(2.0), torch.tensor(1.0)) is not None  # 0-d


def test_float64_outputs_are_compared_in_float64():
    want = norm_like((16, 64))
    t = DEFAULT_TOLERANCE["float64"]
    # 1e-12 relative: invisible in float32, far beyond float64's 22 ulps
    assert compare_tensors(want * (1 + 1e-12), want) is not None
    assert compare_tensors(want * (1 + 4 * eps("float64")), want) is None
    assert t.rtol < 1e-14
    # a float32 output against a float64 reference: float32's tolerance, float64 arithmetic
    assert compare_tensors(want.float(), want) is None
    assert compare_tensors((want * (1 + 1e-5)).float(), want) is not None


def _at_bound_tol(rtol=1.0, agg=1e9):
    return {"float32": Tolerance(rtol=rtol, atol=0.0, atol_rms=0.0, agg=agg, agg_atol=0.0)}


def test_elementwise_bound_is_inclusive():
    """``|g - w| <= rtol |w| + floor``: exactly at the bound passes, one ulp above fails (floor is below
    the float32 rounding of these values, so the bound is exactly ``0.25 * |w|``)."""
    want = torch.tensor([1.0, 2.0, -4.0, 0.5])
    at = want + 0.25 * want.abs()
    assert compare_tensors(at, want, _at_bound_tol(rtol=0.25)) is None
    assert compare_tensors(want - 0.25 * want.abs(), want, _at_bound_tol(rtol=0.25)) is None
    above = at.clone()
    above[1] = torch.nextafter(above[1], torch.tensor(10.0))
    reason = compare_tensors(above, want, _at_bound_tol(rtol=0.25))
    assert reason is not None and reason.startswith("elementwise: 1 of 4") and "at want 2;" in reason
    # zero reference, zero tolerance: the floor alone, inclusive
    zero = torch.zeros(4)
    assert compare_tensors(torch.full((4,), FLOAT32_TINY), zero, _at_bound_tol(rtol=0.0, agg=0.0)) is None
    assert compare_tensors(torch.full((4,), 2 * FLOAT32_TINY), zero, _at_bound_tol(rtol=0.0, agg=0.0)) is not None


def test_worst_element_is_the_one_furthest_beyond_its_bound():
    want = torch.tensor([1.0, 100.0, 3.0])
    got = want * torch.tensor([1.5, 1.2, 1.0])  # 0.5 over a bound of 0.1 (5x) vs 20 over 10 (2x)
    reason = compare_tensors(got, want, _at_bound_tol(rtol=0.1))
    assert reason.startswith("elementwise: 2 of 3") and "at want 1;" in reason


def test_aggregate_bound_is_inclusive_and_reports_the_normalized_error():
    """``rms(g - w) <= agg * rms(w) + agg_atol + floor``, with ``rms(w) = 0.5`` and ``agg = 0.25``:
    an error of exactly 0.125 everywhere passes, one ulp more fails with normalized error 0.25."""
    want = torch.full((4,), 0.5)
    at = want + 0.125
    assert compare_tensors(at, want, _at_bound_tol(agg=0.25)) is None
    above = torch.nextafter(at, torch.tensor(10.0))
    reason = compare_tensors(above, want, _at_bound_tol(agg=0.25))
    assert reason is not None and reason.startswith("aggregate: ")
    assert "normalized error 0.25 vs 0.25" in reason and "rms(want) 0.5" in reason


def test_aggregate_with_a_zero_reference():
    """A zero reference has rms 0: only ``agg_atol + floor`` is left, the normalized error is inf."""
    zero = torch.zeros(8)
    tol = {"float32": Tolerance(rtol=0.1, atol=2.0 ** -9, atol_rms=0.0, agg=0.1, agg_atol=2.0 ** -12)}
    assert compare_tensors(torch.full((8,), 2.0 ** -12), zero, tol) is None
    reason = compare_tensors(torch.full((8,), 2.0 ** -10), zero, tol)  # each within atol, the rms is not
    assert reason is not None and reason.startswith("aggregate: ") and "normalized error inf" in reason
    assert compare_tensors(torch.full((8,), 2.0 ** -8), zero, tol).startswith("elementwise")
    assert compare_tensors(zero.clone(), zero) is None


def test_expected_nan_does_not_hide_other_errors():
    want = torch.tensor([float("nan"), 1.0, 2.0, float("inf")])
    got = want.clone()
    assert compare_tensors(got, want) is None
    got[1] = 1.5
    reason = compare_tensors(got, want)
    assert reason is not None and reason.startswith("elementwise: 1 of 4")
    got = torch.tensor([float("nan"), 1.0, 2.0, float("inf")])
    got[2] = 2 + 1e-3
    assert compare_tensors(got, want, _at_bound_tol(rtol=0.0, agg=1e-5)).startswith("elementwise")


def test_arg_guard_restores_inplace_and_keeps_pristine_copies():
    x = torch.arange(4.0)
    y = torch.zeros(4)
    guard = ArgGuard((x, y, 3), outputs=(1,), inplace=(0,))
    x.mul_(10)
    y.fill_(7)
    pristine = guard.pristine_args()
    assert torch.equal(pristine[0], torch.arange(4.0)) and torch.equal(pristine[1], torch.zeros(4))
    assert pristine[2] == 3
    guard.prepare_checked_run()
    assert torch.equal(x, torch.arange(4.0)) and y.isnan().all()
    x.add_(1)
    guard.restore()
    assert torch.equal(x, torch.arange(4.0)) and torch.equal(y, torch.zeros(4))


def test_checker_reference_gets_copies_and_non_tensor_args():
    x = torch.arange(4.0)
    y = torch.zeros(4)
    guard = ArgGuard((x, y, 2.0), outputs=(1,), inplace=(0,))

    def reference(x, y, scale):  # an in-place reference: writes its output and scales its input
        x.mul_(scale)
        y.copy_(x + 1)
        return y, x

    checker = Checker(reference, guard)
    assert torch.equal(guard.saved[0], torch.arange(4.0)) and torch.equal(guard.saved[1], torch.zeros(4))
    assert torch.equal(x, torch.arange(4.0)) and torch.equal(y, torch.zeros(4))
    guard.prepare_checked_run()
    reference(x, y, 2.0)
    assert checker.compare() is None
    guard.restore()
    assert torch.equal(x, torch.arange(4.0)) and torch.equal(y, torch.zeros(4))


def test_checker_without_reference_or_outputs():
    x, y = torch.ones(3), torch.zeros(3)
    checker = Checker(None, ArgGuard((x, y), outputs=(1,)))
    assert checker.expected is None and checker.compare() is None
    calls = []
    checker = Checker(lambda *a: calls.append(a), ArgGuard((x, y), outputs=()))
    assert calls == [] and checker.expected is None and checker.compare() is None
    with pytest.raises(ValueError, match=r"^the reference returned 1 value\(s\) but the op writes 2 argument\(s\) "
                                         r"\(outputs then in-place ones\)$"):
        Checker(lambda x, y: x, ArgGuard((x, y), outputs=(1,), inplace=(0,)))


def test_a_deferred_reference_runs_once_at_prepare_on_the_pristine_arguments():
    """``defer=True`` (a worker starting its compiles first): nothing runs at construction; :meth:`prepare`
    runs the reference once, on the saved copies of the written arguments; its errors surface there."""
    x, y = torch.arange(4.0), torch.zeros(4)
    calls = []

    def reference(a, b):
        calls.append(b.clone())
        return a * 2

    guard = ArgGuard((x, y), outputs=(1,))
    checker = Checker(reference, guard, defer=True)
    assert calls == [] and not checker.prepared and checker.expected is None
    y.fill_(7.0)  # a written argument changed after the open: the reference still sees the saved copy
    checker.prepare()
    checker.prepare()
    assert len(calls) == 1 and torch.equal(calls[0], torch.zeros(4)) and checker.prepared
    y.copy_(x * 2)
    assert checker.compare() is None
    bad = Checker(lambda a, b: (a, b), ArgGuard((x, y), outputs=(1,)), defer=True)
    with pytest.raises(ValueError, match=r"^the reference returned 2 value\(s\) but the op writes 1 argument"):
        bad.prepare()
    assert Checker(reference, guard).prepared and len(calls) == 2  # not deferred: at construction


def test_checker_uses_each_outputs_own_tolerance_and_joins_reasons():
    x = torch.randn(8, 16, generator=gen(40))
    y1, y2 = torch.empty(8, 16), torch.empty(8, 16)
    guard = ArgGuard((x, y1, y2), outputs=(1, 2))
    loose = {"float32": (0.5, 0.0), "output:1": {"float32": (1.0, 1.0)}}
    checker = Checker(lambda x, a, b: (x * 2, x * 3), guard, loose)
    y1.copy_(x * 2)
    y2.copy_(x * 3 + 0.5)  # outside output 0's bound, inside output 1's own
    assert checker.compare() is None
    y1.copy_(x * 2 + 0.5 + x.abs())
    assert checker.compare().startswith("output 0 (argument 1): elementwise")
    strict = Checker(lambda x, a, b: (x * 2, x * 3), guard)
    y1.copy_(x * 3)
    reason = strict.compare()
    assert reason.startswith("output 0 (argument 1): ") and "; output 1 (argument 2): " in reason


def test_bound_is_not_rounded_to_a_low_precision_output_dtype():
    """bfloat16 outputs are compared in float32: every element two bf16 ulps off passes an rtol of
    exactly 2**-6 and fails one 2**-12 relative below it (which bfloat16 itself would round up to 2**-6)."""
    want = torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=torch.bfloat16)
    got = (want.float() * (1 + 2.0 ** -6)).to(torch.bfloat16)
    assert torch.equal((got.float() - want.float()).abs(), want.float().abs() * 2.0 ** -6)

    def tol(rtol):
        return {"bfloat16": Tolerance(rtol=rtol, atol=0.0, atol_rms=0.0, agg=1.0, agg_atol=0.0)}

    assert compare_tensors(got, want, tol(2.0 ** -6)) is None
    reason = compare_tensors(got, want, tol(2.0 ** -6 * (1 - 2.0 ** -12)))
    assert reason is not None and reason.startswith("elementwise: 4 of 4")


def test_exp_range_of_a_spread_that_overflows_is_the_cap():
    assert exp_range(torch.tensor([[-3e38, 3e38]])) == 128.0
    assert exp_range(torch.tensor([[0.0, 1e300]], dtype=torch.float64)) == 128.0
    assert exp_range(torch.tensor([[float("inf"), float("-inf")]])) == 0.0


def test_a_tolerance_pair_with_a_missing_number_is_refused():
    with pytest.raises(TypeError, match="must both be numbers"):
        tolerance_for(torch.float32, {"float32": (1e-3, None)})
