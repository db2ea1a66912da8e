"""The memory-bound library ops as torch expressions (tiletune.kernels.lowerings): the same numbers as
the ops' references, the same checks, and what ``torch.compile`` makes of them."""

import collections

import pytest
import torch

from tiletune import settings
from tiletune.kernels import lowerings as L
from tiletune.kernels.glu import ACT_GELU_ERF, ACT_GELU_TANH, ACT_SILU, glu_reference
from tiletune.kernels.norms import layer_norm_reference, rms_norm_reference, rms_norm_residual_reference
from tiletune.kernels.rope import rope_reference

BF16 = torch.bfloat16


def randn(*shape, dtype=BF16, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
@pytest.mark.parametrize("with_weight", [True, False])
def test_norms_match_their_references(dtype, with_weight):
    x, r = randn(3, 5, 96, dtype=dtype), randn(3, 5, 96, dtype=dtype, seed=1)
    w = randn(96, dtype=dtype, seed=2) if with_weight else None
    b = randn(96, dtype=dtype, seed=3) if with_weight else None
    y = torch.empty_like(x)
    torch.testing.assert_close(L.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, y, 1e-5, with_weight), rtol=0, atol=0)
    got_y, got_h = L.rms_norm_residual(x, r, w)
    want_y, want_h = rms_norm_residual_reference(x, r, w, y, y, 1e-6, with_weight)
    torch.testing.assert_close(got_h, want_h, rtol=0, atol=0)
    torch.testing.assert_close(got_y, want_y, rtol=0, atol=0)
    torch.testing.assert_close(L.layer_norm(x, w, b), layer_norm_reference(x, w, b, y, 1e-5, with_weight, with_weight),
                               rtol=0, atol=0)
    assert L.rms_norm(x).dtype == dtype and L.rms_norm(x).shape == x.shape


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_gated_activations_match_their_reference(dtype):
    x = randn(7, 2 * 40, dtype=dtype)
    gate, up = x[:, :40], x[:, 40:]
    y = torch.empty((7, 40), dtype=dtype)
    torch.testing.assert_close(L.swiglu(x), glu_reference(gate, up, y, ACT_SILU), rtol=0, atol=0)
    torch.testing.assert_close(L.geglu(x), glu_reference(gate, up, y, ACT_GELU_ERF), rtol=0, atol=0)
    torch.testing.assert_close(L.geglu(x, "tanh"), glu_reference(gate, up, y, ACT_GELU_TANH), rtol=0, atol=0)


def _rope_want(q, k, cos, sin, layout):
    """The op's reference applied to the half views, as the kernel's plan makes them."""
    q4, k4 = (q, k) if layout == "bshd" else (q.transpose(1, 2), k.transpose(1, 2))
    c3 = cos if cos.dim() == 3 else cos.unsqueeze(0)
    s3 = sin if sin.dim() == 3 else sin.unsqueeze(0)
    h = c3.shape[-1] // 2
    r = 2 * h
    q1, q2, k1, k2 = rope_reference(q4[..., :h], q4[..., h:r], k4[..., :h], k4[..., h:r],
                                    c3[..., :h], c3[..., h:], s3[..., :h], s3[..., h:])
    wq, wk = q4.clone(), k4.clone()
    wq[..., :h], wq[..., h:r], wk[..., :h], wk[..., h:r] = q1, q2, k1, k2
    return (wq, wk) if layout == "bshd" else (wq.transpose(1, 2), wk.transpose(1, 2))


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("cos_shape", ["SR", "1SR", "BSR"])
@pytest.mark.parametrize("rotary", [64, 32])
def test_rope_rotates_in_place_like_the_reference(layout, cos_shape, rotary):
    bsz, s, hq, hk, d = 2, 5, 4, 2, 64
    shape = (lambda h: (bsz, s, h, d)) if layout == "bshd" else (lambda h: (bsz, h, s, d))
    q, k = randn(*shape(hq)), randn(*shape(hk), seed=1)
    lead = {"SR": (), "1SR": (1,), "BSR": (bsz,)}[cos_shape]
    cos, sin = randn(*lead, s, rotary, seed=2), randn(*lead, s, rotary, seed=3)
    want_q, want_k = _rope_want(q, k, cos, sin, layout)
    q_before, k_before = q.data_ptr(), k.data_ptr()
    got_q, got_k = L.apply_rope_(q, k, cos, sin, layout)
    assert got_q is q and got_k is k and q.data_ptr() == q_before and k.data_ptr() == k_before
    torch.testing.assert_close(q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(k, want_k, rtol=0, atol=0)


def test_the_checks_of_the_public_functions():
    x = randn(4, 8)
    with pytest.raises(ValueError, match="at least one dimension"):
        L.rms_norm(torch.tensor(1.0))
    with pytest.raises(ValueError, match="'weight' must be a 1-D tensor of 8"):
        L.rms_norm(x, randn(7))
    with pytest.raises(ValueError, match="'residual' must have the shape"):
        L.rms_norm_residual(x, randn(4, 9))
    with pytest.raises(ValueError, match="'bias' must be a 1-D tensor of 8"):
        L.layer_norm(x, None, randn(3))
    with pytest.raises(ValueError, match="must be even"):
        L.swiglu(randn(4, 7))
    with pytest.raises(ValueError, match="approximate"):
        L.geglu(x, "erf")
    q, k = randn(1, 3, 2, 8), randn(1, 3, 2, 8)
    with pytest.raises(ValueError, match="layout"):
        L.apply_rope_(q, k, randn(3, 8), randn(3, 8), "sbhd")
    with pytest.raises(ValueError, match="rotary dimension"):
        L.apply_rope_(q, k, randn(3, 10), randn(3, 10))
    with pytest.raises(ValueError, match="cos/sin must be"):
        L.apply_rope_(q, k, randn(4, 8), randn(4, 8))


def test_the_setting_turns_lowering_off(monkeypatch):
    monkeypatch.delenv("TILETUNE_COMPILE_FUSE", raising=False)
    assert settings.compile_fuse() and L.lowering("rms_norm") is L.rms_norm
    assert L.lowering("matmul") is None and L.lowering("attention") is None and L.lowering("softmax") is None
    monkeypatch.setenv("TILETUNE_COMPILE_FUSE", "off")
    assert L.lowering("rms_norm") is None
    monkeypatch.setenv("TILETUNE_COMPILE_FUSE", "sometimes")
    with pytest.raises(ValueError, match="TILETUNE_COMPILE_FUSE"):
        L.lowering("rms_norm")
    assert any("TILETUNE_COMPILE_FUSE" in p for p in settings.check_all())


def test_inductor_fuses_a_norm_and_a_rope_into_one_graph_without_custom_ops():
    """Through the public functions' compile route: one graph, no tiletune node, the eager numbers."""
    pytest.importorskip("cuda.tile")
    from tiletune.kernels.glu import swiglu
    from tiletune.kernels.norms import rms_norm_residual
    from tiletune.kernels.rope import apply_rope_

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    def block(a, x, w, q, k, cos, sin, u):
        y, h = rms_norm_residual(a, x, w)
        q, k = apply_rope_(q.clone(), k.clone(), cos, sin)
        return y, h, q, k, swiglu(u)

    args = (randn(3, 64), randn(3, 64, seed=1), randn(64, seed=2), randn(1, 3, 4, 32, seed=3),
            randn(1, 3, 2, 32, seed=4), randn(3, 32, seed=5), randn(3, 32, seed=6), randn(3, 128, seed=7))
    torch._dynamo.reset()
    try:
        got = torch.compile(block, fullgraph=True, backend=backend)(*args)
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1
    nodes = collections.Counter(str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function")
    assert not any(t.startswith("tiletune.") for t in nodes), nodes
    want_y, want_h = L.rms_norm_residual(*args[:3])
    want_q, want_k = L.apply_rope_(args[3].clone(), args[4].clone(), args[5], args[6])
    for g, w in zip(got, (want_y, want_h, want_q, want_k, L.swiglu(args[7]))):
        torch.testing.assert_close(g, w, rtol=1.6e-2, atol=1e-2)


def test_dynamic_shapes_trace_without_a_break_and_keep_eps_out_of_the_inputs():
    """``dynamic=True``: the checks hold on symbolic sizes (no graph break), and ``eps`` is a constant of
    the graph, not a float input (which CUDA graph trees would refuse)."""
    pytest.importorskip("cuda.tile")
    from tiletune.kernels.norms import rms_norm
    from tiletune.kernels.rope import apply_rope_

    seen = []

    def backend(gm, example_inputs):
        seen.append(example_inputs)
        return gm.forward

    def block(x, w, q, k, cos, sin):
        q, k = apply_rope_(q.clone(), k.clone(), cos, sin)
        return rms_norm(x, w, 1e-5), q, k

    torch._dynamo.reset()
    try:
        fn = torch.compile(block, fullgraph=True, dynamic=True, backend=backend)
        for n in (3, 5):
            args = (randn(n, 64), randn(64, seed=1), randn(1, n, 4, 32, seed=2), randn(1, n, 2, 32, seed=3),
                    randn(n, 32, seed=4), randn(n, 32, seed=5))
            y, q, k = fn(*args)
            want_q, want_k = L.apply_rope_(args[2].clone(), args[3].clone(), args[4], args[5])
            torch.testing.assert_close(y, L.rms_norm(args[0], args[1], 1e-5), rtol=0, atol=0)
            torch.testing.assert_close(q, want_q, rtol=0, atol=0)
            torch.testing.assert_close(k, want_k, rtol=0, atol=0)
    finally:
        torch._dynamo.reset()
    assert len(seen) == 1  # one graph for both sizes
    assert not any(isinstance(a, float) or (isinstance(a, torch.Tensor) and a.dim() == 0) for a in seen[0])
