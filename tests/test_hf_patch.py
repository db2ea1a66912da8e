"""CPU tests of :mod:`tiletune.kernels.hf`: the wiring of tiletune's ops into Hugging Face Llama and Qwen2.

The ``tiletune.kernels`` ops are replaced by pure-torch references (recording each call), and the
module's device / dtype sets are widened to CPU float32, so these tests check what the patch calls,
with what shapes, and that a patched model's logits equal the unpatched model's in prefill, in
decode steps over the model's own cache, through ``generate``, with padding (SDPA fallback), after
``revert()`` and with class-level patching. The ops themselves run in ``tests/test_gpu_hf_patch.py``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402

import tiletune.kernels as K  # noqa: E402
import tiletune.kernels.hf as hf  # noqa: E402

VOCAB = 128
HIDDEN = 256  # 4 heads of 64 (a head dim the attention op takes), 2 key-value heads
#: transformers >= 4.53 has the attention mask interface the attention patch needs (older: patch skipped)
ATTN = hf._register_attention()
MODELS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, hf.apply_tiletune_to_llama),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, hf.apply_tiletune_to_qwen2),
}


class Calls:
    """The reference ops, recording ``(op, shapes, flags)`` per call."""

    def __init__(self) -> None:
        self.log: list[tuple[str, tuple, dict]] = []

    def count(self, op: str) -> int:
        return sum(1 for name, _, _ in self.log if name == op)

    def of(self, op: str) -> list[tuple[tuple, dict]]:
        return [(shapes, flags) for name, shapes, flags in self.log if name == op]

    def rms_norm(self, x, weight, eps=1e-6):
        self.log.append(("rms_norm", (tuple(x.shape),), {"eps": eps}))
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)

    def apply_rope_(self, q, k, cos, sin, layout="bshd"):
        self.log.append(("apply_rope_", (tuple(q.shape), tuple(k.shape), tuple(cos.shape)), {"layout": layout}))
        assert layout in ("bshd", "bhsd")
        q4, k4 = (q, k) if layout == "bshd" else (q.transpose(1, 2), k.transpose(1, 2))
        assert cos.shape == sin.shape and cos.dim() in (2, 3) and cos.shape[-2] == q4.shape[1]
        assert cos.dim() == 2 or cos.shape[0] in (1, q4.shape[0])
        c = (cos if cos.dim() == 3 else cos.unsqueeze(0)).float().unsqueeze(2)  # (Bc, S, 1, R)
        s = (sin if sin.dim() == 3 else sin.unsqueeze(0)).float().unsqueeze(2)
        r = cos.shape[-1]
        for x in (q4, k4):
            xf = x[..., :r].float()
            rot = torch.cat((-xf[..., r // 2:], xf[..., : r // 2]), -1)
            x[..., :r] = (xf * c + rot * s).to(x.dtype)  # in place, like the op
        return q, k

    def swiglu(self, x):
        self.log.append(("swiglu", (tuple(x.shape),), {}))
        h = x.shape[-1] // 2
        return (F.silu(x[..., :h].float()) * x[..., h:].float()).to(x.dtype)

    def attention(self, q, k, v, causal=False, scale=None):
        self.log.append(("attention", (tuple(q.shape), tuple(k.shape)), {"causal": causal, "scale": scale}))
        assert q.shape[1] % k.shape[1] == 0 and k.shape == v.shape
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)


_CALLS: list[Calls] = []


@pytest.fixture
def ops(monkeypatch):
    calls = Calls()
    _CALLS[:] = [calls]
    for name in ("rms_norm", "apply_rope_", "swiglu", "attention"):
        monkeypatch.setattr(K, name, getattr(calls, name), raising=False)
    monkeypatch.setattr(hf, "_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(hf, "_ATTN_DTYPES", (torch.bfloat16, torch.float16, torch.float32))
    return calls


@pytest.fixture(autouse=True)
def _no_leftover_patches():
    yield
    assert not hf._ROPE, "a test left the RoPE function patched"


def build(kind: str, seed: int = 0, layers: int = 2):
    config_cls, model_cls, _ = MODELS[kind]
    cfg = config_cls(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=layers,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights, so a norm that ignored them would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


def cache_kw(model) -> str:
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def out_cache(out):
    return out.__dict__.get("cache") if out.__dict__.get("cache") is not None else out.past_key_values


def step(model, ids, cache=None, mask=None):
    kw = {"use_cache": True}
    if cache is not None:
        kw[cache_kw(model)] = cache
    if mask is not None:
        kw["attention_mask"] = mask
    with torch.no_grad():
        out = model(ids, **kw)
    return out.logits, out_cache(out)


@contextlib.contextmanager
def cuda_only():
    """The ops' device set back to CUDA only, for the unpatched reference model: the RoPE patch is
    module-wide, so on this CPU run the reference would otherwise rotate through the stand-in op too."""
    saved = hf._DEVICE_TYPES
    hf._DEVICE_TYPES = ("cuda",)
    n = len(_CALLS[0].log) if _CALLS else 0
    try:
        yield
    finally:
        hf._DEVICE_TYPES = saved
    assert not _CALLS or len(_CALLS[0].log) == n, "the reference model called an op"


def ref_step(model, ids, cache=None, mask=None):
    with cuda_only():
        return step(model, ids, cache, mask)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_prefill_and_decode_match_unpatched(kind, ops):
    ref = build(kind)
    model = copy.deepcopy(ref)
    report = MODELS[kind][2](model)
    try:
        assert set(report.patched) | set(report.skipped) == {"rms_norm", "rope", "swiglu", "attention"}
        assert ("attention" in report.patched) == ATTN and report.target == "model"
        assert model.config._attn_implementation == (hf.ATTN_IMPLEMENTATION if ATTN else "sdpa")
        ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))

        want, ref_cache = ref_step(ref, ids)
        got, cache = step(model, ids)
        close(got, want)
        layers = model.config.num_hidden_layers
        assert ops.count("rms_norm") == 2 * layers + 1
        assert ops.count("apply_rope_") == layers and ops.count("swiglu") == layers
        assert ops.count("attention") == (layers if ATTN else 0)
        if ATTN:
            (shapes, flags), *_ = ops.of("attention")
            assert shapes == ((2, 4, 9, 64), (2, 2, 9, 64)) and flags["causal"] is True
            assert flags["scale"] == pytest.approx(64 ** -0.5)
        (shapes, flags), *_ = ops.of("apply_rope_")
        assert shapes == ((2, 4, 9, 64), (2, 2, 9, 64), (1, 9, 64)) and flags["layout"] == "bhsd"
        assert ops.of("swiglu")[0][0] == ((2, 9, 192),)  # gate and up as one (2I) GEMM output
        assert ops.of("rms_norm")[0][0] == ((2, 9, HIDDEN),)

        # two decode steps over each model's own cache (the rotated keys the patched model cached)
        nxt = want[:, -1].argmax(-1, keepdim=True)
        for t in range(2):
            ops.log.clear()
            want, ref_cache = ref_step(ref, nxt, ref_cache)
            got, cache = step(model, nxt, cache)
            close(got, want)
            if ATTN:
                (shapes, flags), *_ = ops.of("attention")
                assert shapes == ((2, 4, 1, 64), (2, 2, 10 + t, 64)) and flags["causal"] is False
            assert ops.count("apply_rope_") == layers
            nxt = want[:, -1].argmax(-1, keepdim=True)
    finally:
        report.revert()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_generate_matches_unpatched(kind, ops):
    ref = build(kind, seed=3)
    model = copy.deepcopy(ref)
    report = hf.apply_tiletune(model)
    try:
        ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
        kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
        with cuda_only():
            want = ref.generate(ids, **kw)
        got = model.generate(ids, **kw)
        assert torch.equal(got, want)
        assert ops.count("attention") == (2 * 5 if ATTN else 0)  # prefill + 4 decode steps, 2 layers
    finally:
        report.revert()


def test_padding_mask_falls_back_to_sdpa(ops):
    ref = build("llama")
    model = copy.deepcopy(ref)
    report = hf.apply_tiletune(model)
    try:
        ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(4))
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, :3] = 0  # left padding: a real mask reaches the attention function
        want, _ = ref_step(ref, ids, mask=mask)
        got, _ = step(model, ids, mask=mask)
        close(got, want)
        assert ops.count("attention") == 0  # SDPA's path took the masked calls
        assert ops.count("apply_rope_") == 2 and ops.count("swiglu") == 2  # the rest still patched
    finally:
        report.revert()


def test_unsupported_calls_fall_back(ops, monkeypatch):
    ref = build("qwen2")
    model = copy.deepcopy(ref)
    report = hf.apply_tiletune(model)
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(5))
    try:
        # gradients needed: the ops are forward only, so every part runs the original code
        out = model(ids).logits
        assert ops.log == [] and out.requires_grad
        close(out.detach(), ref_step(ref, ids)[0])
        # a device the ops do not take (the default set: CUDA only)
        monkeypatch.setattr(hf, "_DEVICE_TYPES", ("cuda",))
        got, _ = step(model, ids)
        assert ops.log == []
        close(got, ref_step(ref, ids)[0])
    finally:
        report.revert()


def test_revert_restores_the_model(ops):
    ref = build("llama")
    model = copy.deepcopy(ref)
    modeling = transformers.models.llama.modeling_llama
    original_rope = modeling.apply_rotary_pos_emb
    report = hf.apply_tiletune(model)
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(6))
    step(model, ids)
    mlp = model.model.layers[0].mlp
    fused = mlp.__dict__[hf._FUSED]
    assert mlp.gate_proj.weight.data_ptr() == fused.data_ptr()  # gate/up are views of one buffer
    assert modeling.apply_rotary_pos_emb is not original_rope
    report.revert()
    report.revert()  # idempotent
    assert modeling.apply_rotary_pos_emb is original_rope
    assert model.config._attn_implementation == "sdpa"
    assert hf._FUSED not in mlp.__dict__ and mlp.gate_proj.weight.data_ptr() != fused.data_ptr()
    assert all("forward" not in m.__dict__ for m in model.modules())
    ops.log.clear()
    got, _ = step(model, ids)
    assert ops.log == []
    close(got, ref_step(ref, ids)[0])
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n


def test_fused_weights_stay_ordinary_tensors_under_inference_mode(ops):
    ref = build("llama")
    model = copy.deepcopy(ref)
    report = hf.apply_tiletune(model)
    ids = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(9))
    try:
        with torch.inference_mode():
            model(ids)
        mlp = model.model.layers[1].mlp
        assert hf._FUSED in mlp.__dict__ and not mlp.gate_proj.weight.is_inference()
        loss = model(ids).logits.sum()  # a training-style call (gradients needed) still works
        loss.backward()
        assert mlp.gate_proj.weight.grad is not None
    finally:
        report.revert()


def test_selected_parts_only(ops):
    model = build("llama")
    report = hf.apply_tiletune_to_llama(model, rope=False, attention=False)
    try:
        assert set(report.patched) == {"rms_norm", "swiglu"}
        assert model.config._attn_implementation == "sdpa" and not hf._ROPE
        step(model, torch.zeros(1, 4, dtype=torch.long))
        assert ops.count("apply_rope_") == 0 and ops.count("attention") == 0 and ops.count("swiglu") == 2
    finally:
        report.revert()


def test_class_level_patch_reaches_models_built_later(ops, tmp_path):
    ref = build("qwen2", seed=7)
    ref.save_pretrained(tmp_path)
    report = hf.apply_tiletune_to_qwen2()
    try:
        assert report.target == "classes"
        model = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
        assert model.config._attn_implementation == (hf.ATTN_IMPLEMENTATION if ATTN else "sdpa")
        ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(8))
        got, _ = step(model, ids)
        assert ops.count("rms_norm") == 5 and ops.count("swiglu") == 2
        assert ops.count("attention") == (2 if ATTN else 0)
        close(got, ref_step(ref, ids)[0])
        # an instance patch on top of the class patch, then both reverted in turn
        inner = hf.apply_tiletune(model)
        inner.revert()
        ops.log.clear()
        step(model, ids)
        assert ops.count("rms_norm") == 5
    finally:
        report.revert()
    built_after = build("qwen2")
    assert built_after.config._attn_implementation == "sdpa"
    ops.log.clear()
    step(built_after, torch.zeros(1, 3, dtype=torch.long))
    assert ops.count("rms_norm") == 0 and ops.count("swiglu") == 0 and ops.count("apply_rope_") == 0


def test_dispatch_rejects_unknown_model_types():
    class Cfg:
        model_type = "gpt2"

    class Model:
        config = Cfg()

    with pytest.raises(ValueError, match="gpt2"):
        hf.apply_tiletune(Model())
    with pytest.raises(ValueError, match="model_type"):
        hf.apply_tiletune_to_llama(build("qwen2"))


def test_core_does_not_import_transformers():
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, tiletune, tiletune.kernels, tiletune.kernels.hf; "
            "print('transformers' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(Path(hf.__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


def test_patched_forwards_trace_under_torch_compile(ops):
    ref = build("llama")
    model = copy.deepcopy(ref)
    report = hf.apply_tiletune(model)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(10))
    try:
        step(model, ids)  # eager first: fuses gate/up, as a compiled graph never re-lays weights
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager")
        ops.log.clear()
        with torch.no_grad():
            got = compiled(ids, use_cache=True).logits  # with a cache (as generate): no packed-sequence mask
        close(got, ref_step(ref, ids)[0])
        print({k: ops.count(k) for k in ("rms_norm", "apply_rope_", "swiglu", "attention")})
        # the stand-in ops' logging is a side effect dynamo replays: each patched part ran in the graph
        assert ops.count("rms_norm") == 5 and ops.count("apply_rope_") == 2 and ops.count("swiglu") == 2
        assert ops.count("attention") == (2 if ATTN else 0)
    finally:
        torch._dynamo.reset()
        report.revert()
