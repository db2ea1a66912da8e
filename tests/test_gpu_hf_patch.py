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
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

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
#: ``||patched - unpatched|| / ||unpatched||`` of the logits: both sides round in bfloat16 at different
#: places (the ops compute in float32 and round once), over two layers
REL_TOL = 2e-2


@pytest.fixture(autouse=True)
def _tuning_db(tmp_path, monkeypatch):
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "tuning.db"))


def build(kind: str):
    config_cls, model_cls, dims = SHAPES[kind]
    cfg = config_cls(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=8192, **dims)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_cls(cfg)
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
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
    ref = build(kind)
    calls = Counter(monkeypatch)
    ids = torch.randint(0, VOCAB, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    want, ref_cache = run(ref, ids)  # before patching: the RoPE patch is module-wide
    nxt = want[:, -1].argmax(-1, keepdim=True)
    want_steps = []
    for _ in range(3):
        logits, ref_cache = run(ref, nxt, ref_cache)
        want_steps.append(logits)
        nxt = logits[:, -1].argmax(-1, keepdim=True)
    assert not calls.n

    model = ref
    report = hf.apply_tiletune(model)
    try:
        assert set(report.patched) == {"rms_norm", "rope", "swiglu", "attention"}, report
        got, cache = run(model, ids)
        assert rel_err(got, want) < REL_TOL
        assert calls.n == {"rms_norm": 5, "apply_rope_": 2, "swiglu": 2, "attention": 2}, calls.n
        nxt = want[:, -1].argmax(-1, keepdim=True)
        for step, w in enumerate(want_steps):  # the same tokens as the reference, over the patched cache
            calls.n.clear()
            logits, cache = run(model, nxt, cache)
            assert rel_err(logits, w) < REL_TOL, step
            assert calls.n == {"rms_norm": 5, "apply_rope_": 2, "swiglu": 2, "attention": 2}, calls.n
            nxt = w[:, -1].argmax(-1, keepdim=True)
        # gate and up projections share one buffer now
        mlp = model.model.layers[0].mlp
        assert mlp.gate_proj.weight.data_ptr() == getattr(mlp, hf._FUSED).data_ptr()
    finally:
        report.revert()
    again, _ = run(model, ids)
    assert rel_err(again, want) < 1e-3  # reverted: the SDPA model again


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_generate_with_patched_model(kind):
    model = build(kind)
    ids = torch.randint(0, VOCAB, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        want = model.generate(ids, output_scores=True, return_dict_in_generate=True, **kw)
    report = hf.apply_tiletune(model)
    try:
        with torch.inference_mode():
            got = model.generate(ids, output_scores=True, return_dict_in_generate=True, **kw)
    finally:
        report.revert()
    # random weights give near-ties, so greedy tokens may part after a step: compare the first step's scores
    assert rel_err(got.scores[0], want.scores[0]) < REL_TOL
    assert got.sequences.shape == want.sequences.shape
