"""GPU tests of the per-call paths of issue 12: library-op recipes (tiletune.kernels.fastcall) on every op,
``bind``, and keys met for the first time inside a CUDA graph capture (run with ``pytest -m gpu``)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cuda.tile")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import tiletune as tt  # noqa: E402
import tiletune.kernels as K  # noqa: E402
from tiletune.kernels.library_op import LibraryOp  # noqa: E402

F = torch.nn.functional
FAST = tt.TunerOptions(stopping=tt.StoppingRule(min_samples=3, max_samples=10, max_seconds=0.05),
                       showdown_rounds=1)
BF = torch.bfloat16


@pytest.fixture(scope="module", autouse=True)
def fresh_database(tmp_path_factory, monkeypatch_module):
    path = tmp_path_factory.mktemp("tuning") / "t.db"
    monkeypatch_module.setenv("TILETUNE_DB", str(path))
    LibraryOp.configure(db=tt.TuningDB(path), options=FAST, progress=False)
    yield
    LibraryOp.configure()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def rope_ref(q, cos, sin):
    """Rotate-half RoPE with per-half cos/sin (``cos[..., :h]`` for the first half, ``cos[..., h:]``
    for the second, as the kernel reads them)."""
    h = cos.shape[-1] // 2
    q1, q2 = q[..., :h].float(), q[..., h:2 * h].float()
    c, s = cos[None, :, None, :].float(), sin[None, :, None, :].float()
    out = q.float().clone()
    out[..., :h] = q1 * c[..., :h] - q2 * s[..., :h]
    out[..., h:2 * h] = q2 * c[..., h:] + q1 * s[..., h:]
    return out.to(q.dtype)


def rms_ref(x, w, eps=1e-6):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.float() if w is not None else y).to(x.dtype)


def cases():
    """(name, wrapped public function, make_args(), reference(args) -> expected, compare(got, expected))."""

    def close(atol=3e-2, rtol=3e-2):
        return lambda got, exp: torch.testing.assert_close(got, exp, atol=atol, rtol=rtol)

    def rel(got, exp):
        err = (got.float() - exp.float()).abs().max().item()
        assert err <= 2e-2 * exp.float().abs().max().item() + 1e-2, err

    w4 = torch.randn(4096, device="cuda", dtype=BF)
    b4 = torch.randn(4096, device="cuda", dtype=BF)
    wt = torch.randn(4096, 4096, device="cuda", dtype=BF) / 64
    cos = torch.randn(64, 128, device="cuda", dtype=BF)
    sin = torch.randn(64, 128, device="cuda", dtype=BF)

    def rand(*shape, dtype=BF):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    def rope_args():
        qkv = rand(1, 64, 48 * 128)
        q = qkv[..., : 32 * 128].view(1, 64, 32, 128)
        k = qkv[..., 32 * 128: 40 * 128].view(1, 64, 8, 128)
        return q, k, cos, sin

    def rope_decode_args():  # as Hugging Face's Llama passes them in decode: (B, H, 1, D) views, cos (B, 1, D)
        q = rand(8, 1, 32 * 128).view(8, 1, 32, 128).transpose(1, 2)
        k = rand(8, 1, 8 * 128).view(8, 1, 8, 128).transpose(1, 2)
        half = rand(8, 1, 64)
        return q, k, torch.cat((half.cos(), half.cos()), -1), torch.cat((half.sin(), half.sin()), -1), "bhsd"

    def rope_decode_ref(a):
        c, s_ = a[2].float().unsqueeze(1), a[3].float().unsqueeze(1)

        def rot(x):
            x = x.float()
            return (x * c + torch.cat((-x[..., 64:], x[..., :64]), -1) * s_).to(BF)

        return rot(a[0]), rot(a[1])

    def rope_check(args, got):
        q, k, _, _ = args
        assert got[0] is q and got[1] is k

    return [
        ("rms_norm", K.rms_norm, lambda: (rand(8, 4096), w4, 1e-6), lambda a: rms_ref(a[0], a[1]), close()),
        ("rms_norm_noweight", K.rms_norm, lambda: (rand(1, 4096),), lambda a: rms_ref(a[0], None), close()),
        ("rms_norm_residual", K.rms_norm_residual, lambda: (rand(2, 4, 4096), rand(2, 4, 4096), w4),
         lambda a: (rms_ref((a[0].float() + a[1].float()).to(BF), a[2]), (a[0].float() + a[1].float()).to(BF)),
         lambda g, e: (close()(g[0], e[0]), close()(g[1], e[1]))),
        ("layer_norm", K.layer_norm, lambda: (rand(8, 4096), w4, b4),
         lambda a: F.layer_norm(a[0].float(), (4096,), a[1].float(), a[2].float()).to(BF), close(6e-2, 3e-2)),
        ("softmax", K.softmax, lambda: (rand(8, 4096),), lambda a: torch.softmax(a[0].float(), -1).to(BF),
         close(1e-3, 2e-2)),
        ("swiglu", K.swiglu, lambda: (rand(8, 2 * 4096),),
         lambda a: (F.silu(a[0][:, :4096].float()) * a[0][:, 4096:].float()).to(BF), close()),
        ("geglu", K.geglu, lambda: (rand(1, 2 * 4096),),
         lambda a: (F.gelu(a[0][:, :4096].float()) * a[0][:, 4096:].float()).to(BF), close()),
        ("cross_entropy", K.cross_entropy, lambda: (rand(8, 32000), torch.randint(0, 32000, (8,), device="cuda")),
         lambda a: F.cross_entropy(a[0].float(), a[1]), close(1e-2, 1e-2)),
        ("matmul_linear", K.matmul, lambda: (rand(8, 4096), wt.t()), lambda a: (a[0].float() @ a[1].float()).to(BF),
         rel),
        ("matmul_m1", K.matmul, lambda: (rand(1, 4096), wt), lambda a: (a[0].float() @ a[1].float()).to(BF), rel),
        ("attention", K.attention, lambda: (rand(1, 8, 128, 128), rand(1, 8, 128, 128), rand(1, 8, 128, 128), True),
         lambda a: F.scaled_dot_product_attention(a[0], a[1], a[2], is_causal=True), close(2e-2, 2e-2)),
        ("apply_rope_", K.apply_rope_, rope_args, None, rope_check),
        # a decode step over a KV cache passed whole: the split-KV kernels with a lengths tensor the op makes
        ("attention_decode", K.attention,
         lambda: (rand(8, 32, 1, 128), rand(8, 8, 1024, 128), rand(8, 8, 1024, 128), False),
         lambda a: F.scaled_dot_product_attention(a[0], a[1], a[2], enable_gqa=True), close(2e-2, 2e-2)),
        ("apply_rope_decode", K.apply_rope_, rope_decode_args, rope_decode_ref,
         lambda g, e: (close()(g[0], e[0]), close()(g[1], e[1]))),
    ]


CASE_NAMES = ["rms_norm", "rms_norm_noweight", "rms_norm_residual", "layer_norm", "softmax", "swiglu", "geglu",
              "cross_entropy", "matmul_linear", "matmul_m1", "attention", "apply_rope_", "attention_decode",
              "apply_rope_decode"]


@pytest.mark.parametrize("case_name", CASE_NAMES)
def test_recipe_replays_every_op(case_name):
    name, fn, make, ref, compare = {c[0]: c for c in cases()}[case_name]
    wrapper = fn.fastcall
    times = []
    for i in range(5):
        args = make()
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        torch.cuda.synchronize()
        t = time.perf_counter()
        got = fn(*args)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        if ref is None:  # in-place rope: compare with the rotation of the saved inputs
            compare(args, got)
            torch.testing.assert_close(args[0], rope_ref(before[0], args[2], args[3]), atol=3e-2, rtol=3e-2)
            torch.testing.assert_close(args[1], rope_ref(before[1], args[2], args[3]), atol=3e-2, rtol=3e-2)
        else:
            compare(got, ref(before))
    assert wrapper.recipes, f"{name}: no recipe; refusals: {wrapper.refusals}"
    from tiletune.kernels import fastcall

    slow, misses = wrapper.slow_calls, wrapper.guard_misses
    fn(*make())
    assert wrapper.slow_calls == slow, f"{name}: a call with a learnt signature ran the slow path"
    assert wrapper.guard_misses == misses, f"{name}: no remembered guard passed a call of a replayed signature"
    assert fastcall.report()[wrapper.name]["recipes"] >= 1
    # the first replay compiles nothing (views passed by array interface reuse the tuned kernel)
    assert times[2] < 0.05, times


def test_bind_and_capture_of_a_user_op(tmp_path):
    @ct.kernel
    def twice(X, Y, T: ct.Constant[int]):
        i = ct.bid(0)
        ct.store(Y, (i,), ct.load(X, index=(i,), shape=(T,)) * 2.0)

    space = tt.Space(T=[128, 256], baseline=dict(T=256))

    @tt.autotune(space, reference=lambda x, y: x * 2, writes=["y"], db=tt.TuningDB(tmp_path / "u.db"),
                 progress=False, options=FAST, isolation="none")
    def op(cfg, x, y):
        return tt.Launch(twice, (x.shape[0] // cfg.T,), (x, y, cfg.T))

    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    assert op(x, y=y) is y
    torch.testing.assert_close(y, x * 2)
    run = op.bind(x, y)
    y.zero_()
    assert run() is y
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * 2)

    # a new key inside capture: no tuning, the capture holds, the replay is right
    x2 = torch.randn(2048, device="cuda")
    y2 = torch.zeros_like(x2)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        op(x2, y2)
    assert len(op.pending) == 1 and op.tuning_count == 1
    x2.normal_()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y2, x2 * 2)
    tuned = op.tune_pending()
    assert len(tuned) == 1 and op.pending == [] and op.tuning_count == 2


def test_library_op_new_shape_inside_capture():
    x = torch.randn(24, 1536, device="cuda", dtype=BF)
    w = torch.randn(1536, device="cuda", dtype=BF)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = K.rms_norm(x, w)
    x.normal_()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, rms_ref(x, w), atol=3e-2, rtol=3e-2)
    # outside capture the key is tuned at its next call and the result is still right
    y2 = K.rms_norm(x, w)
    torch.testing.assert_close(y2, rms_ref(x, w), atol=3e-2, rtol=3e-2)


# ---------------------------------------------------------------------------------------------- call guards


def test_call_guards_serve_cuda_calls_and_never_a_stale_recipe():
    """Library ops on CUDA tensors go through the call guards (tiletune.op.guards) once learnt; a call that
    differs in dtype, strides or shape gets its own recipe and the right result."""
    from tiletune.op import guards

    if not guards.guards_available():
        pytest.skip("this torch has no TensorGuards")
    w = torch.randn(512, device="cuda", dtype=BF)
    fast = K.rms_norm.fastcall
    for _ in range(4):
        x = torch.randn(6, 512, device="cuda", dtype=BF)
        torch.testing.assert_close(K.rms_norm(x, w), rms_ref(x, w), rtol=2e-2, atol=2e-2)
    assert fast.guards.rows, "no guard learnt for a repeated CUDA signature"
    variants = [torch.randn(6, 512, device="cuda", dtype=torch.float16),
                torch.randn(512, 6, device="cuda", dtype=BF).t(),  # strides
                torch.randn(7, 512, device="cuda", dtype=BF)]
    for x in variants:
        ww = w.to(x.dtype)
        for _ in range(3):
            got = K.rms_norm(x, ww)
            assert got.dtype == x.dtype and got.shape == x.shape
            torch.testing.assert_close(got, rms_ref(x, ww), rtol=2e-2, atol=2e-2)


@ct.kernel
def _double_kernel(X, Y, T: ct.Constant[int]):
    i = ct.bid(0)
    ct.store(Y, (i,), ct.load(X, index=(i,), shape=(T,)) * 2)


def test_tuned_op_call_guards_on_cuda_tensors():
    """A user's tuned op on CUDA tensors: the second call of a key learns its guard, later calls skip
    the key, and another dtype of the same shape is tuned and launched as its own key."""

    @tt.autotune(tt.Space(T=[128, 256], baseline=dict(T=128)), reference=lambda x, y: x * 2, writes=["y"],
                 db=False, progress=False, options=FAST)
    def double(cfg, x, y):
        return tt.Launch(_double_kernel, (x.shape[0] // cfg.T,), (x, y, cfg.T))

    x, y = torch.randn(1024, device="cuda"), torch.empty(1024, device="cuda")
    double(x, y)
    double(x, y)
    assert double._fast.rows
    built = []
    key = double._key
    double._key = lambda a: built.append(1) or key(a)
    x2, y2 = torch.randn(1024, device="cuda"), torch.empty(1024, device="cuda")
    double(x2, y2)
    torch.cuda.synchronize()
    torch.testing.assert_close(y2, x2 * 2)
    assert built == []
    xh, yh = x2.half(), torch.empty(1024, device="cuda", dtype=torch.float16)
    double(xh, yh)
    torch.cuda.synchronize()
    torch.testing.assert_close(yh, xh * 2)
    assert built and double.tuning_count == 2
