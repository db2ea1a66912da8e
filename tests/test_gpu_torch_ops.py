"""GPU tests of the library ops under ``torch.compile`` and CUDA graphs (run with ``pytest -m gpu``).

A small decoder block (hidden 256, 4 query heads and 2 key/value heads of 64, sequence 64, batch 2,
bfloat16: RMSNorm, fused qkv matmul, in-place RoPE on q/k views of the qkv output, causal GQA
attention, output projection, fused residual RMSNorm, SwiGLU MLP) written with the public
functions of :mod:`tiletune.kernels` runs

(a) eagerly and under ``torch.compile(fullgraph=True)`` (the ops become their custom ops);
(b) under ``torch.compile(mode="reduce-overhead")`` (CUDA graph trees), three calls;
(c) captured by hand in a ``torch.cuda.graph`` after one eager warm-up, replayed on new data;

each compared with the eager block on the same data (every op runs the same tuned config, so the
results agree to rounding); the eager block is also checked against torch's own ops once. The
block runs both through the public functions (which route to the custom ops while compiling) and
through :func:`tiletune.kernels.torch_ops.compiled_call` directly. Each op alone is compiled too.

Eager calls come first so every key is tuned before compiling; shapes are small and measurements
short, so tuning is quick (the memory-bound ops tune against no database at all).
"""

from __future__ import annotations

import functools
import importlib
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

# a skip for the whole module without CUDA, as a marker: `-m "not gpu"` deselects these tests
# quietly instead of listing a skipped module
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import tiletune as tt  # noqa: E402
from tiletune.kernels import _DECODE_OPS, _FUSED_OPS, _MEMORY_OPS  # noqa: E402
from tiletune.kernels.library_op import LibraryOp  # noqa: E402
from tiletune.kernels.torch_ops import PUBLIC_OPS, compiled_call  # noqa: E402

F = torch.nn.functional
DEV = "cuda"
BF16 = torch.bfloat16
B, S, H, HKV, D, FF = 2, 64, 4, 2, 64, 512
HID = H * D
TOL = 5e-2  # max abs error, relative to max(1, the largest output): a few bfloat16 ulps of the block's O(1) outputs


FAST = tt.TunerOptions(stopping=tt.StoppingRule(min_samples=3, max_samples=10, max_seconds=0.05),
                       showdown_rounds=1)


@pytest.fixture(scope="module", autouse=True)
def library_settings(tmp_path_factory):
    """No database and short measurements for every library op (matmul's and attention's included)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TILETUNE_DB", str(tmp_path_factory.mktemp("tuning") / "t.db"))
    LibraryOp.configure(db=False, progress=False, options=FAST)
    yield
    LibraryOp.configure()
    mp.undo()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def public_functions():
    """The public functions, taken from their defining modules."""
    where = {**_MEMORY_OPS, **_FUSED_OPS, **_DECODE_OPS, "matmul": "gemm", "attention": "attention_op"}
    return types.SimpleNamespace(**{name: getattr(importlib.import_module(f"tiletune.kernels.{mod}"), name)
                                    for name, mod in where.items()})


def custom_op_functions():
    """The same names calling the custom ops through :func:`compiled_call`, compiling or not."""
    return types.SimpleNamespace(**{name: functools.partial(compiled_call, name) for name in PUBLIC_OPS})


APIS = {"public": public_functions(), "compiled_call": custom_op_functions()}


def gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def randn(*shape, seed, scale=1.0, dtype=BF16):
    return (torch.randn(shape, device=DEV, generator=gen(seed)) * scale).to(dtype)


@pytest.fixture(scope="module")
def weights():
    return {
        "norm1": (1.0 + randn(HID, seed=1, scale=0.1, dtype=torch.float32)).to(BF16),
        "qkv": randn(HID, (H + 2 * HKV) * D, seed=2, scale=HID ** -0.5),
        "o": randn(HID, HID, seed=3, scale=HID ** -0.5),
        "norm2": (1.0 + randn(HID, seed=4, scale=0.1, dtype=torch.float32)).to(BF16),
        "up": randn(HID, 2 * FF, seed=5, scale=HID ** -0.5),
        "down": randn(FF, HID, seed=6, scale=FF ** -0.5),
    }


def rope_tables(seq):
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=DEV, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(seq, device=DEV, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(BF16), emb.sin().to(BF16)


def block_inputs(seed, seq=S):
    cos, sin = rope_tables(seq)
    return randn(B, seq, HID, seed=seed), cos, sin


def make_block(K, W, fused_mlp=False):
    """The decoder block; with ``fused_mlp`` its gate-up projection and SwiGLU are one ``K.matmul_swiglu``."""

    def block(x, cos, sin):
        b, s, _ = x.shape
        h = K.rms_norm(x, W["norm1"])
        qkv = K.matmul(h, W["qkv"])
        q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
        q, k, v = q.view(b, s, H, D), k.view(b, s, HKV, D), v.view(b, s, HKV, D)
        K.apply_rope_(q, k, cos, sin)  # in place, on views of qkv
        o = K.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        a = K.matmul(o.transpose(1, 2).reshape(b, s, HID), W["o"])
        y, res = K.rms_norm_residual(a, x, W["norm2"])
        g = K.matmul_swiglu(y, W["up"]) if fused_mlp else K.swiglu(K.matmul(y, W["up"]))
        return K.matmul(g, W["down"]) + res

    return block


def torch_block(W, x, cos, sin):
    """The same math with torch ops (float32 inside each op, bfloat16 between ops)."""
    b, s, _ = x.shape

    def rms(t, w):
        return F.rms_norm(t.float(), (HID,), w.float(), 1e-6).to(BF16)

    def rope(t):
        tf, c, sn = t.float(), cos.float()[None, :, None, :], sin.float()[None, :, None, :]
        rot = torch.cat([-tf[..., D // 2:], tf[..., :D // 2]], dim=-1)
        return (tf * c + rot * sn).to(BF16)

    qkv = rms(x, W["norm1"]) @ W["qkv"]
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    q, k, v = rope(q.view(b, s, H, D)), rope(k.view(b, s, HKV, D)), v.view(b, s, HKV, D)
    rep = H // HKV
    o = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float().repeat_interleave(rep, 1),
                                       v.transpose(1, 2).float().repeat_interleave(rep, 1), is_causal=True).to(BF16)
    a = o.transpose(1, 2).reshape(b, s, HID) @ W["o"]
    res = (a.float() + x.float()).to(BF16)
    u = (rms(res, W["norm2"]) @ W["up"]).float()
    g = (F.silu(u[..., :FF]) * u[..., FF:]).to(BF16)
    return g @ W["down"] + res


def max_abs(a, b):
    return float((a.float() - b.float()).abs().max())


def assert_close(got, want, what="", tol=TOL):
    scale = max(1.0, float(want.float().abs().max()))
    err = max_abs(got, want)
    assert err <= tol * scale, f"{what}: max abs error {err:.3g} > {tol} * {scale:.3g}"


def rel_rms(a, b):
    return float(torch.linalg.vector_norm(a.float() - b.float()) / torch.linalg.vector_norm(b.float()))


def cudagraph_skips():
    return torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


# ---------------------------------------------------------------------------------------------
# (a) torch.compile(fullgraph=True) vs eager
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", list(APIS))
def test_block_compiled_fullgraph_matches_eager(api, weights):
    block = make_block(APIS[api], weights)
    x, cos, sin = block_inputs(seed=10)
    want = block(x, cos, sin)  # eager first: every key is tuned here
    torch.cuda.synchronize()
    assert want.shape == (B, S, HID) and want.dtype == BF16
    assert rel_rms(want, torch_block(weights, x, cos, sin)) < 2e-2

    compiled = torch.compile(block, fullgraph=True)
    got = compiled(x, cos, sin)
    torch.cuda.synchronize()
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_close(got, want, "compiled")

    x2 = block_inputs(seed=11)[0]  # new data, same shapes: no recompilation needed
    assert_close(compiled(x2, cos, sin), block(x2, cos, sin), "compiled, new data")


@pytest.mark.parametrize("api", list(APIS))
def test_fused_mlp_block_compiled_fullgraph_matches_eager(api, weights):
    """The block with ``matmul_swiglu`` for its MLP: one graph, the eager fused block's output, and
    the unfused block's to rounding."""
    block = make_block(APIS[api], weights, fused_mlp=True)
    x, cos, sin = block_inputs(seed=12)
    want = block(x, cos, sin)
    torch.cuda.synchronize()
    assert want.shape == (B, S, HID) and want.dtype == BF16
    assert rel_rms(want, torch_block(weights, x, cos, sin)) < 2e-2
    explanation = torch._dynamo.explain(block)(x, cos, sin)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    torch._dynamo.reset()
    got = torch.compile(block, fullgraph=True)(x, cos, sin)
    torch.cuda.synchronize()
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_close(got, want, "compiled fused block")


# ---------------------------------------------------------------------------------------------
# (b) torch.compile(mode="reduce-overhead"): CUDA graph trees around the custom ops
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", list(APIS))
def test_block_reduce_overhead_matches_eager(api, weights):
    block = make_block(APIS[api], weights)
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    skips = cudagraph_skips()
    for i in range(3):  # warm-up run, recording run, replay
        x, cos, sin = block_inputs(seed=20 + i)
        want = block(x, cos, sin)
        got = compiled(x, cos, sin).clone()  # the next replay overwrites the graph's output
        torch.cuda.synchronize()
        assert_close(got, want, f"call {i}")
    assert cudagraph_skips() == skips, "inductor skipped CUDA graphs for the block"


# ---------------------------------------------------------------------------------------------
# (c) manual torch.cuda.graph capture of the eager block
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", list(APIS))
def test_block_manual_cuda_graph_capture(api, weights):
    block = make_block(APIS[api], weights)
    x, cos, sin = block_inputs(seed=30)
    static_x = x.clone()
    first = block(static_x, cos, sin)  # warm-up (tunes if needed)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = block(static_x, cos, sin)
    for seed in (31, 32):
        new_x = block_inputs(seed=seed)[0]
        static_x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        want = block(new_x, cos, sin)
        assert_close(static_out, want, f"replay on data {seed}")
        assert max_abs(static_out, first) > 0.5, "the replay did not recompute"


# ---------------------------------------------------------------------------------------------
# every op alone under torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------------


def _rope(K):
    def fn(q, k, cos, sin):
        q, k = q.clone(), k.clone()
        return K.apply_rope_(q, k, cos, sin)

    return fn


def _append(K):
    def fn(ck, cv, k, v, start):
        ck, cv = ck.clone(), cv.clone()
        return K.kv_cache_append(ck, cv, k, v, start)

    return fn


def _starts(s):
    return torch.tensor([3, 60], dtype=torch.int32, device=DEV)


FP8 = getattr(torch, "float8_e4m3fn", None)

#: name -> (function of the api namespace, inputs(seed))
SINGLE_OPS = {
    "rms_norm": (lambda K: lambda x, w: K.rms_norm(x, w), lambda s: (randn(8, 256, seed=s), randn(256, seed=s + 1))),
    "rms_norm_residual": (lambda K: lambda x, r: K.rms_norm_residual(x, r),
                          lambda s: (randn(8, 256, seed=s), randn(8, 256, seed=s + 1))),
    "layer_norm": (lambda K: lambda x, w, b: K.layer_norm(x, w, b),
                   lambda s: (randn(8, 256, seed=s), randn(256, seed=s + 1), randn(256, seed=s + 2))),
    "softmax": (lambda K: lambda x: K.softmax(x, dim=1), lambda s: (randn(4, 8, 100, seed=s),)),
    "swiglu": (lambda K: lambda x: K.swiglu(x), lambda s: (randn(8, 512, seed=s),)),
    "geglu": (lambda K: lambda x: K.geglu(x, approximate="tanh"), lambda s: (randn(8, 512, seed=s),)),
    "apply_rope_": (_rope, lambda s: (randn(2, 32, 4, 64, seed=s), randn(2, 32, 2, 64, seed=s + 1),
                                      *rope_tables(32))),
    "cross_entropy": (lambda K: lambda x, t: K.cross_entropy(x, t, return_grad=True),
                      lambda s: (randn(16, 1000, seed=s),
                                 torch.randint(0, 1000, (16,), device=DEV, generator=gen(s)))),
    "matmul": (lambda K: lambda a, b: K.matmul(a, b),
               lambda s: (randn(3, 16, 256, seed=s), randn(256, 128, seed=s + 1))),
    "attention": (lambda K: lambda q, k, v: K.attention(q, k, v, causal=True),
                  lambda s: (randn(1, 4, 64, 64, seed=s), randn(1, 2, 64, 64, seed=s + 1),
                             randn(1, 2, 64, 64, seed=s + 2))),
    "matmul_swiglu": (lambda K: lambda x, w: K.matmul_swiglu(x, w),
                      lambda s: (randn(3, 16, 256, seed=s), randn(256, 2 * 128, seed=s + 1, scale=0.0625))),
    "matmul_swiglu_wt": (lambda K: lambda x, w: K.matmul_swiglu(x, w.t()),  # W.t() of a [2N, K] weight
                         lambda s: (randn(16, 256, seed=s), randn(2 * 128, 256, seed=s + 1, scale=0.0625))),
    "attention_short_query": (lambda K: lambda q, k, v: K.attention(q, k, v),  # attention's decode route
                              lambda s: (randn(2, 4, 1, 64, seed=s), randn(2, 2, 96, 64, seed=s + 1),
                                         randn(2, 2, 96, 64, seed=s + 2))),
    "decode_attention": (lambda K: lambda q, ck, cv, lens: K.decode_attention(q, ck, cv, lens),
                         lambda s: (randn(2, 4, 2, 64, seed=s), randn(2, 2, 128, 64, seed=s + 1),
                                    randn(2, 2, 128, 64, seed=s + 2), _starts(s) + 2)),
    "decode_attention_int": (lambda K: lambda q, ck, cv: K.decode_attention(q, ck, cv, 77, causal=False, scale=0.1),
                             lambda s: (randn(2, 4, 1, 128, seed=s), randn(2, 2, 128, 128, seed=s + 1),
                                        randn(2, 2, 128, 128, seed=s + 2))),
    "kv_cache_append": (_append, lambda s: (randn(2, 2, 128, 64, seed=s), randn(2, 2, 128, 64, seed=s + 1),
                                           randn(2, 2, 2, 64, seed=s + 2), randn(2, 2, 2, 64, seed=s + 3),
                                           _starts(s))),
    "kv_cache_append_int": (lambda K: lambda ck, cv, k, v: _append(K)(ck, cv, k, v, 17),
                            lambda s: (randn(2, 2, 128, 64, seed=s), randn(2, 2, 128, 64, seed=s + 1),
                                       randn(2, 2, 2, 64, seed=s + 2), randn(2, 2, 2, 64, seed=s + 3))),
}
if FP8 is not None:
    SINGLE_OPS["matmul_fp8_float_scales"] = (
        lambda K: lambda a, b: K.matmul(a, b, scale_a=0.5, scale_b=2.0),
        lambda s: (randn(32, 256, seed=s).to(FP8), randn(256, 64, seed=s + 1).to(FP8)))


def _leaves(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _fused_cases():
    """(op, TILETUNE_COMPILE_FUSE) pairs: every op as it compiles by default, and the memory-bound ones also
    as their custom ops (fusion off)."""
    from tiletune.kernels.lowerings import FUSED_OPS

    return [(name, "1") for name in SINGLE_OPS] + [(name, "0") for name in SINGLE_OPS if name in FUSED_OPS]


@pytest.mark.parametrize("name,fuse", _fused_cases())
def test_each_op_compiled_fullgraph_matches_eager(name, fuse, monkeypatch):
    monkeypatch.setenv("TILETUNE_COMPILE_FUSE", fuse)
    torch._dynamo.reset()
    make_fn, make_inputs = SINGLE_OPS[name]
    fn = make_fn(APIS["public"])
    inputs = make_inputs(100)
    want = _leaves(fn(*inputs))
    got = _leaves(torch.compile(fn, fullgraph=True)(*inputs))
    torch.cuda.synchronize()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.shape, g.dtype, g.stride()) == (w.shape, w.dtype, w.stride())
        assert_close(g, w, name, TOL if w.dtype == BF16 else 1e-5)


# ---------------------------------------------------------------------------------------------
# a decode step (kv_cache_append, then decode_attention) under torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------------

CAP, SQ = 256, 1


def decode_step(K):
    def step(q, cache_k, cache_v, k, v, start, lengths):
        cache_k, cache_v = K.kv_cache_append(cache_k, cache_v, k, v, start)
        return K.decode_attention(q, cache_k, cache_v, lengths)

    return step


@pytest.mark.parametrize("kind", ["int", "tensor"])
@pytest.mark.parametrize("api", list(APIS))
def test_decode_step_compiled_fullgraph_matches_eager(api, kind):
    """Two decode steps on caches of capacity 256 (start and lengths as ints or as (B,) tensors updated in
    place): one graph with both custom ops and no break; the compiled step writes the caches and
    attends exactly as the eager step does."""
    step = decode_step(APIS[api])
    ck0, cv0 = randn(B, HKV, CAP, D, seed=40), randn(B, HKV, CAP, D, seed=41)
    pos = [37, 100]  # per batch entry (one int for both when kind == "int")
    start_t = torch.tensor(pos, dtype=torch.int32, device=DEV)
    lens_t = start_t + SQ

    def args(i):
        q, k, v = randn(B, H, SQ, D, seed=50 + i), randn(B, HKV, SQ, D, seed=60 + i), randn(B, HKV, SQ, D, seed=70 + i)
        if kind == "int":
            return q, k, v, pos[0] + i, pos[0] + i + SQ
        start_t.copy_(torch.tensor(pos, dtype=torch.int32, device=DEV) + i)
        lens_t.copy_(start_t + SQ)
        return q, k, v, start_t, lens_t

    eager_k, eager_v = ck0.clone(), cv0.clone()
    comp_k, comp_v = ck0.clone(), cv0.clone()
    q, k, v, start, lengths = args(0)
    explanation = torch._dynamo.explain(step)(q, ck0.clone(), cv0.clone(), k, v, start, lengths)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    names = [str(n.target) for g in explanation.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("tiletune.kv_cache_append" in n for n in names) and any("tiletune.decode_attention" in n for n in names)
    torch._dynamo.reset()

    compiled = torch.compile(step, fullgraph=True)
    for i in range(2):
        q, k, v, start, lengths = args(i)
        want = step(q, eager_k, eager_v, k, v, start, lengths)  # eager first: tunes every key
        got = compiled(q, comp_k, comp_v, k, v, start, lengths)
        torch.cuda.synchronize()
        assert (got.shape, got.dtype) == (want.shape, want.dtype) == ((B, H, SQ, D), BF16)
        assert torch.equal(comp_k, eager_k) and torch.equal(comp_v, eager_v), f"step {i}: caches differ"
        assert_close(got, want, f"{api}/{kind} step {i}")
