"""GPU test of :mod:`tiletune.kernels.hf`: Hugging Face Llama and Qwen2 with full 8B layer dimensions
(Llama-3-8B: hidden 4096, 32/8 heads of 128, MLP 14336; Qwen2.5-7B: 3584, 28/4, 128, 18944), two
layers, random weights, bfloat16, patched with the real ops: the logits of the patched model against
the unpatched (SDPA) model in prefill, in decode steps over each model's own cache and through
``generate``; and that every patched part really ran a tiletune op (no silent fallback).

Run on the GPU host: ``python -m pytest -m gpu -q tests/test_gpu_hf_patch.py``. The ops tune on first
use into a tuning database under ``tmp_path``.
"""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("cuda.tile")
pytestmark = [pytest.mark.gpu, pytest.mark.served, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import tiletune.kernels as K  # noqa: E402
import tiletune.kernels.hf as hf  # noqa: E402

VOCAB = 32000
SHAPES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                   rope_theta=500000.0, rms_norm_eps=1e-5)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
                   rope_theta=1000000.0, rms_norm_eps=1e-6)),
}
#: Both bfloat16 models are compared with the same model run in float32: the patched model's error may
#: exceed the unpatched (SDPA) model's by this factor (both round in bfloat16, at different places: the ops
#: compute in float32 and round once), plus :data:`SLACK`.
ERR_FACTOR = 1.5
SLACK = 2e-3


def close_enough(patched, unpatched, exact) -> tuple[bool, float, float]:
    """Whether the patched logits are as close to the float32 logits as the unpatched ones (within the factor)."""
    e_patched, e_unpatched = rel_err(patched, exact), rel_err(unpatched, exact)
    return e_patched <= ERR_FACTOR * e_unpatched + SLACK, e_patched, e_unpatched


@pytest.fixture(autouse=True)
def _tuning_db(tmp_path, monkeypatch):
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "tuning.db"))


def build(kind: str, dtype=torch.bfloat16):
    config_cls, model_cls, dims = SHAPES[kind]
    cfg = config_cls(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=8192, **dims)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_cls(cfg)
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model = model.to(dtype)
    assert model.model.layers[0].self_attn.head_dim == 128
    return model


def rel_err(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def run(model, ids, cache=None):
    kw = {"use_cache": True}
    if cache is not None:
        kw["past_key_values"] = cache
    with torch.inference_mode():
        out = model(ids, **kw)
    cache = out.__dict__.get("cache") if out.__dict__.get("cache") is not None else out.past_key_values
    return out.logits, cache


class Counter:
    def __init__(self, monkeypatch):
        self.n = {}
        for name in ("rms_norm", "apply_rope_", "swiglu", "attention"):
            real = getattr(K, name)

            def wrapped(*a, _real=real, _name=name, **k):
                self.n[_name] = self.n.get(_name, 0) + 1
                return _real(*a, **k)

            monkeypatch.setattr(K, name, wrapped)


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_patched_logits_match_unpatched(kind, monkeypatch):
    ids = torch.randint(0, VOCAB, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    exact_model = build(kind, torch.float32)
    exact, exact_cache = run(exact_model, ids)
    nxt = exact[:, -1].argmax(-1, keepdim=True)
    exact_steps, step_tokens = [], [nxt]
    for _ in range(3):
        logits, exact_cache = run(exact_model, nxt, exact_cache)
        exact_steps.append(logits)
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        step_tokens.append(nxt)
    del exact_model, exact_cache
    ref = build(kind)
    calls = Counter(monkeypatch)
    want, ref_cache = run(ref, ids)  # before patching: the RoPE patch is module-wide
    want_steps = []
    for nxt in step_tokens[:3]:
        logits, ref_cache = run(ref, nxt, ref_cache)
        want_steps.append(logits)
    assert not calls.n

    model = ref
    report = hf.apply_tiletune(model)
    try:
        assert set(report.patched) == {"rms_norm", "rope", "swiglu", "attention"}, report
        got, cache = run(model, ids)
        ok, e_got, e_want = close_enough(got, want, exact)
        assert ok, (e_got, e_want)
        assert calls.n == {"rms_norm": 5, "apply_rope_": 2, "swiglu": 2, "attention": 2}, calls.n
        for step, (nxt, w, x) in enumerate(zip(step_tokens, want_steps, exact_steps)):  # the same tokens
            calls.n.clear()
            logits, cache = run(model, nxt, cache)
            ok, e_got, e_want = close_enough(logits, w, x)
            assert ok, (step, e_got, e_want)
            assert calls.n == {"rms_norm": 5, "apply_rope_": 2, "swiglu": 2, "attention": 2}, calls.n
        # gate and up projections share one buffer now
        mlp = model.model.layers[0].mlp
        assert mlp.gate_proj.weight.data_ptr() == getattr(mlp, hf._FUSED).data_ptr()
    finally:
        report.revert()
    again, _ = run(model, ids)
    assert rel_err(again, want) < 1e-3  # reverted: the SDPA model again


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_generate_with_patched_model(kind):
    ids = torch.randint(0, VOCAB, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    exact_model = build(kind, torch.float32)
    with torch.inference_mode():
        exact = exact_model.generate(ids, output_scores=True, return_dict_in_generate=True, **kw)
    del exact_model
    model = build(kind)
    with torch.inference_mode():
        want = model.generate(ids, output_scores=True, return_dict_in_generate=True, **kw)
    report = hf.apply_tiletune(model)
    try:
        with torch.inference_mode():
            got = model.generate(ids, output_scores=True, return_dict_in_generate=True, **kw)
    finally:
        report.revert()
    # random weights give near-ties, so greedy tokens may part after a step: compare the first step's scores
    ok, e_got, e_want = close_enough(got.scores[0], want.scores[0], exact.scores[0])
    assert ok, (e_got, e_want)
    assert got.sequences.shape == want.sequences.shape


@pytest.mark.parametrize("fuse", ["1", "0"])
@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_compiled_decode_is_one_graph_of_the_ops(kind, fuse, monkeypatch):
    """``torch.compile(model)`` (Inductor) over decode steps as ``benchmarks/hf_patch.py`` times them (one
    token over a ``DynamicCache``, cropped back): the patched model compiles into one graph, with no graph
    break and no recompilation, holding the ops as ``torch.ops.tiletune`` nodes; its logits are the eager
    patched model's (docs/COMPILE-TAX.md). By default RMSNorm, RoPE and SwiGLU are torch expressions that
    Inductor fuses, and only attention is a custom op; with ``TILETUNE_COMPILE_FUSE=0`` all four are."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TILETUNE_COMPILE_FUSE", fuse)
    from torch._inductor.compile_fx import compile_fx

    gen = torch.Generator("cuda").manual_seed(3)
    prompt = torch.randint(0, VOCAB, (4, 128), device="cuda", generator=gen)
    ids = torch.randint(0, VOCAB, (4, 1), device="cuda", generator=gen)
    model = build(kind)
    report = hf.apply_tiletune(model)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    def step(fwd):
        logits, _ = run(fwd, ids, cache)
        cache.crop(-(cache.get_seq_length() - 128))
        return logits.float()

    try:
        _, cache = run(model, prompt)  # eager and patched: tunes the ops and fuses the gate/up weights
        want = step(model)
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(model, backend=backend)
        got = [step(compiled)]
        with torch._dynamo.config.patch(error_on_recompile=True):
            got += [step(compiled) for _ in range(3)]
        assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
        assert len(graphs) == 1
        nodes = {}
        for n in graphs[0].graph.nodes:
            if n.op == "call_function" and str(n.target).startswith("tiletune."):
                name = str(n.target).split(".")[1]
                nodes[name] = nodes.get(name, 0) + 1
        every = {"rms_norm": 5, "apply_rope_": 2, "swiglu": 2, "attention": 2}
        assert nodes == (every if fuse == "0" else {"attention": 2}), nodes
        for x in got:
            assert rel_err(x, want) < 2e-2  # Inductor rounds the rest of the layer in other places
    finally:
        torch._dynamo.reset()
        report.revert()
