"""CPU tests of a Hugging Face model patched by :mod:`tiletune.kernels.hf` under ``torch.compile`` (issue 43).

The patched forwards call the real public functions of :mod:`tiletune.kernels`; while Dynamo traces they
route to ``torch.ops.tiletune.*`` (:mod:`tiletune.kernels.torch_ops`), whose implementations are bound to
pure-torch stand-ins here (``torch_ops.bind``). Eager patched calls (the prefill, and the first call that
fuses the gate/up weights) go through the same custom ops. Decode is timed by ``benchmarks/hf_patch.py``
the same way: one new token over a ``DynamicCache``, then ``cache.crop`` back, so every step sees one
cache length. Checked: the patched model compiles into as many graphs as the unpatched one (one), with
no graph break and no recompilation over several steps, the ops are nodes of that graph, and its
logits match the unpatched model's.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import inspect

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("cuda.tile")  # the public functions' modules import it (their compiled route does not run it)

import torch.nn.functional as F  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import tiletune.kernels as K  # noqa: E402
import tiletune.kernels.hf as hf  # noqa: E402
from tiletune.kernels import torch_ops  # noqa: E402

VOCAB = 128
OPS = ("rms_norm", "apply_rope_", "swiglu", "attention")
MODELS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
}
ATTN = hf._register_attention()


# stand-ins with the op's positional arguments and the fake's output layout (new contiguous tensors)
def _rms_norm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _apply_rope_(q, k, cos, sin, layout):
    assert layout == "bhsd"
    c, s, r = cos.float().unsqueeze(1), sin.float().unsqueeze(1), cos.shape[-1]
    for x in (q, k):
        xf = x.float()
        x.copy_((xf * c + torch.cat((-xf[..., r // 2:], xf[..., : r // 2]), -1) * s).to(x.dtype))


def _swiglu(x):
    h = x.shape[-1] // 2
    return (F.silu(x[..., :h].float()) * x[..., h:].float()).to(x.dtype)


def _attention(q, k, v, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True).contiguous()


@pytest.fixture
def standins(monkeypatch):
    before = {name: torch_ops.bind(name, fn) for name, fn in
              zip(OPS, (_rms_norm, _apply_rope_, _swiglu, _attention))}
    monkeypatch.setattr(hf, "_DEVICE_TYPES", ("cuda", "cpu"))
    yield
    for name, fn in before.items():
        torch_ops.bind(name, fn)
    torch._dynamo.reset()


@contextlib.contextmanager
def eager_ops():
    """Eager calls of the public functions through the custom ops (the CPU has no cuTile kernel)."""
    saved = {name: getattr(K, name) for name in OPS}
    for name in OPS:
        setattr(K, name, (lambda n: lambda *a, **kw: torch_ops.compiled_call(n, *a, **kw))(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(K, name, fn)


def build(kind: str):
    config_cls, model_cls = MODELS[kind]
    cfg = config_cls(vocab_size=VOCAB, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_cls(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


class Decode:
    """``hf_patch.py``'s decode row: a prefilled cache, then one token per call, cropped back after it."""

    def __init__(self, model, bsz: int = 2, seq: int = 24) -> None:
        gen = torch.Generator().manual_seed(1)
        self.seq = seq
        self.kw = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
        prompt = torch.randint(0, VOCAB, (bsz, seq), generator=gen)
        self.ids = torch.randint(0, VOCAB, (bsz, 1), generator=gen)
        with torch.inference_mode():
            out = model(prompt, use_cache=True)
        c = out.__dict__.get("cache")
        self.cache = c if c is not None else out.past_key_values
        self.step(model)  # the cache now has the layout every later step sees (a crop of a longer tensor)

    def step(self, fwd):
        with torch.inference_mode():
            logits = fwd(input_ids=self.ids, use_cache=True, **{self.kw: self.cache}).logits
        self.cache.crop(-(self.cache.get_seq_length() - self.seq))
        return logits.float()


def compiled_steps(model, decode: Decode, n: int, inductor: bool = True, **compile_kw):
    """``n`` decode steps through ``torch.compile(model)``: (graph breaks, graphs, logits of each step);
    raises on any recompilation. ``inductor=False``: Dynamo's graph run as it is (no code generation)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        if not inductor:
            return gm.forward
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=backend, **compile_kw)
    logits = [decode.step(compiled)]
    with torch._dynamo.config.patch(error_on_recompile=True):  # every later step reuses the first graph
        logits += [decode.step(compiled) for _ in range(n - 1)]
    breaks = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    return breaks, graphs, logits


def tiletune_nodes(gm) -> collections.Counter:
    """Calls of ``torch.ops.tiletune.<name>`` (the packet or an overload) in a Dynamo graph, by name."""
    return collections.Counter(str(n.target).split(".")[1] for n in gm.graph.nodes
                               if n.op == "call_function" and str(n.target).startswith("tiletune."))


def rel_err(got, want) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_patched_decode_compiles_into_one_graph_like_the_unpatched_model(kind, fuse, standins, monkeypatch):
    """With ``TILETUNE_COMPILE_FUSE=0`` every patched op is its custom op in the graph; by default only
    attention is (RMSNorm, RoPE and SwiGLU are torch expressions that Inductor fuses). The default runs
    through Inductor; the custom-op variant runs Dynamo's graph as it is (the suite's time: Inductor's CPU
    code generation is the slow part, and it has nothing to fuse around a custom op)."""
    monkeypatch.setenv("TILETUNE_COMPILE_FUSE", "1" if fuse else "0")
    ref = build(kind)
    ref_decode = Decode(ref)
    want = ref_decode.step(ref)
    ref_breaks, ref_graphs, ref_logits = compiled_steps(ref, ref_decode, 4, inductor=fuse)
    assert len(ref_graphs) == 1 and ref_breaks == 0  # the baseline this test holds the patch to
    assert all(rel_err(x, want) < 2e-2 for x in ref_logits)

    model = copy.deepcopy(ref)
    report = hf.apply_tiletune(model)
    try:
        with eager_ops():
            decode = Decode(model)  # eager: fuses the gate/up weights, as a compiled graph never does
            eager = decode.step(model)
        assert rel_err(eager, want) < 2e-2
        breaks, graphs, logits = compiled_steps(model, decode, 4, inductor=fuse)
        assert breaks == 0, f"{breaks} graph breaks: {dict(counters['graph_break'])}"
        assert len(graphs) == 1
        layers = model.config.num_hidden_layers
        every = {"rms_norm": 2 * layers + 1, "apply_rope_": layers, "swiglu": layers}
        assert tiletune_nodes(graphs[0]) == {**({} if fuse else every), **({"attention": layers} if ATTN else {})}
        for x in logits:  # the same logits at every step (same cache length), as the unpatched model's
            assert rel_err(x, want) < 2e-2
            torch.testing.assert_close(x, eager, rtol=2e-2, atol=2e-2)
    finally:
        report.revert()


@pytest.mark.skipif(not ATTN, reason="transformers without the attention mask interface")
def test_patched_decode_has_no_graph_break_with_dynamic_shapes(standins):
    ref = build("llama")
    ref_breaks, _, _ = compiled_steps(ref, Decode(ref), 2, inductor=False, dynamic=True)
    model = copy.deepcopy(ref)
    report = hf.apply_tiletune(model)
    try:
        with eager_ops():
            decode = Decode(model)
        # the attention scale is then a symbolic float: math.isfinite on it broke the graph in every layer.
        # Graph breaks are Dynamo's: its graph runs as it is (Inductor's code generation for symbolic shapes
        # is half a minute of the suite; the fused test above compiles through Inductor)
        breaks, graphs, _ = compiled_steps(model, decode, 2, inductor=False, dynamic=True)
        assert breaks <= ref_breaks, dict(counters["graph_break"])
        assert sum(tiletune_nodes(g)["attention"] for g in graphs) == model.config.num_hidden_layers
    finally:
        report.revert()


def test_rope_refuses_q_and_k_sharing_memory(standins):
    q = torch.randn(1, 2, 3, 64, dtype=torch.bfloat16)
    cos = torch.randn(1, 3, 64, dtype=torch.bfloat16)
    assert hf._rope_layout(q, q, cos, cos, 1) is None  # rotated twice otherwise
    assert hf._rope_layout(q, q.clone(), cos, cos, 1) == "bhsd"
    assert hf._rope_layout(q, q.view(q.shape), cos, cos, 1) is None  # a view: eagerly, the pointers tell
    # traced: one tensor twice is refused too (a custom op's distinct alias sets do not stop it), without a break
    layout = torch.compile(lambda a, b, c: hf._rope_layout(a, b, c, c, 1), backend="eager", fullgraph=True)
    assert layout(q, q, cos) is None
    assert layout(q, q.clone(), cos) == "bhsd"
