"""Keys that mean the problem (issue 40, item 3) and ``tune --model`` calls (item 5), on meta tensors (no GPU).

A decoder layer written with the library ops (:func:`tiletune.lab.fill.decoder_layer`) is run through
:class:`tiletune.lab.fill.KeyRecorder`, which builds each op's launch arguments with the op's own
``prepare_*`` function and computes the stored key the op's identity would hold.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

from tiletune.kernels._keys import convert_stored_key  # noqa: E402
from tiletune.lab import fill  # noqa: E402

LLAMA = "llama3-8b"


def _by_op(keys, name):
    return [json.loads(k)[1] for n, _, k in keys if n == name]


def _problems(keys):
    return {(n, k) for n, _, k in keys}


def test_prefill_keys_count_tokens_not_how_they_split():
    a = fill.layer_keys(LLAMA, "prefill", 3, 1500)
    b = fill.layer_keys(LLAMA, "prefill", 1, 4500)
    for name in ("tiletune.gemm", "tiletune.rope", "tiletune.rms_norm", "tiletune.swiglu"):
        assert _by_op(a, name) == _by_op(b, name), name
    gemms = _by_op(a, "tiletune.gemm")
    assert [(g["M"], g["N"], g["K"], g["layout"]) for g in gemms] == [
        (8192, 6144, 4096, "nt"), (8192, 4096, 4096, "nt"), (8192, 28672, 4096, "nt"), (8192, 4096, 14336, "nt")]
    (rope,) = _by_op(a, "tiletune.rope")
    assert rope["tokens"] == 8192 and rope["q_heads"] == 32 and rope["kv_heads"] == 8
    (att3,) = _by_op(a, "tiletune.attention")
    assert att3 == {"problem": "attention", "batch_heads": 128, "group": 4, "q_len": 2048, "kv_len": 2048,
                    "head_dim": 128, "causal": True, "dtype": "bfloat16"}
    # prefill lengths within one power-of-two bucket share every key
    assert _problems(fill.layer_keys(LLAMA, "prefill", 3, 1400)) == _problems(a)


def test_decode_keys_do_not_hold_the_cache_capacity_or_its_batch():
    a = fill.layer_keys(LLAMA, "decode", 16, 4096)
    b = fill.layer_keys(LLAMA, "decode", 16, 8192)
    tuned = lambda ks: {(n, k) for n, _, k in ks if n != "tiletune.kv_cache_append"}  # noqa: E731 (one config)
    assert tuned(a) == tuned(b)
    (d,) = _by_op(a, "tiletune.decode_attention_direct")
    assert d == {"problem": "decode_attention", "batch": 16, "kv_heads": 8, "group": 4, "q_len": 1, "head_dim": 128,
                 "kv_len": 8192, "causal": True, "dtype": "bfloat16"}
    # batch 12 takes the same bucket; a long cache another length bucket
    assert tuned(fill.layer_keys(LLAMA, "decode", 12, 6000)) == tuned(a)
    (far,) = _by_op(fill.layer_keys(LLAMA, "decode", 16, 16384), "tiletune.decode_attention_direct")
    assert far["kv_len"] == 65536
    # small batches split the cache: the partial kernel, same named problem
    (p,) = _by_op(fill.layer_keys(LLAMA, "decode", 1, 4096), "tiletune.decode_attention")
    assert p["batch"] == 1 and p["kv_len"] == 8192


def test_views_of_a_fused_qkv_output_key_like_separate_tensors():
    rec = fill.KeyRecorder()
    b, s, hq, hk, d = 2, 300, 32, 8, 128
    qkv = torch.empty(b, s, (hq + 2 * hk) * d, dtype=torch.bfloat16, device="meta")
    q = qkv[..., :hq * d].unflatten(-1, (hq, d))
    k = qkv[..., hq * d:(hq + hk) * d].unflatten(-1, (hk, d))
    v = qkv[..., (hq + hk) * d:].unflatten(-1, (hk, d))
    cos = torch.empty(s, d, dtype=torch.bfloat16, device="meta")
    rec.apply_rope_(q, k, cos, cos)
    rec.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    sep = fill.KeyRecorder()
    qs, ks = (torch.empty(b, s, h, d, dtype=torch.bfloat16, device="meta") for h in (hq, hk))
    sep.apply_rope_(qs, ks, cos, cos)
    qc, kc = torch.empty(b, hq, s, d, dtype=torch.bfloat16, device="meta"), torch.empty(b, hk, s, d,
                                                                                          dtype=torch.bfloat16,
                                                                                          device="meta")
    sep.attention(qc, kc, kc, causal=True)
    assert rec.keys == sep.keys


def test_matmul_names_the_linear_layout_and_folds_leading_dims():
    rec = fill.KeyRecorder()
    x = torch.empty(4, 33, 512, dtype=torch.bfloat16, device="meta")
    w = torch.empty(1024, 512, dtype=torch.bfloat16, device="meta")  # nn.Linear weight [N, K]
    rec.matmul(x, w.t())
    rec.matmul(x.reshape(132, 512), w.t())
    rec.matmul(x, torch.empty(512, 1024, dtype=torch.bfloat16, device="meta"))
    k1, k2, k3 = (json.loads(k)[1] for _, _, k in rec.keys)
    assert k1 == k2 and k1["M"] == 256 and k1["layout"] == "nt" and (k1["N"], k1["K"]) == (1024, 512)
    assert k3["layout"] == "nn" and {**k3, "layout": "nt"} == k1


def _call_keys(call):
    rec = fill.KeyRecorder()
    args, kwargs = fill.materialize(call, "meta")
    getattr(rec, call.op.split(":")[1])(*args, **kwargs)
    return rec.keys


@pytest.mark.parametrize("phase,length", [("prefill", (1, 1024)), ("decode", (1, 4096))])
def test_layer_calls_warm_every_key_of_the_range(phase, length):
    batch = (1, 4)
    calls = fill.layer_calls(LLAMA, phase, batch, length)
    warmed = {k for c in calls for k in _call_keys(c)}
    # every size of the range: its layer's keys are among the warmed ones (here on a grid of sizes)
    for b in range(batch[0], batch[1] + 1):
        for n in sorted({length[0], 3, 100, 255, 256, 257, 700, length[1] // 2 + 1, length[1]}):
            if length[0] <= n <= length[1]:
                missing = set(fill.layer_keys(LLAMA, phase, b, n)) - warmed
                assert not missing, (b, n, missing)
    # and no call is redundant: each brings a key no earlier call had
    seen = set()
    for c in calls:
        ks = set(_call_keys(c))
        assert ks - seen, c.describe()
        seen |= ks


def test_layer_calls_are_tensor_specs_the_fill_can_make():
    calls = fill.layer_calls(LLAMA, "decode", 16, 4096)
    ops = [c.op.split(":")[1] for c in calls]
    assert ops == ["rms_norm", "matmul", "apply_rope_", "kv_cache_append", "decode_attention", "matmul", "matmul",
                   "swiglu", "matmul"]
    qkv = calls[1]
    assert qkv.args[1] == {"shape": [4096, 6144], "dtype": "bfloat16", "fill": "normal", "transposed": True}
    assert calls[4].args[3] == 4096  # decode attention over the whole cache


def test_stored_keys_convert_where_it_is_a_pure_rekeying():
    gemm_old = [{"bucketed": True}, {"contiguous": True, "dtype": "bfloat16", "shape": [1, 64, 4096]},
                {"contiguous": True, "dtype": "bfloat16", "shape": [1, 1024, 4096]},
                {"contiguous": True, "dtype": "bfloat16", "shape": [1, 64, 1024]},
                {"contiguous": True, "dtype": "float32", "shape": [1]},
                {"contiguous": True, "dtype": "float32", "shape": [1]}, False, True, False]
    new = convert_stored_key("tiletune.gemm", gemm_old)
    assert new[1] == {"problem": "gemm", "batch": 1, "M": 64, "N": 1024, "K": 4096, "layout": "nt",
                      "dtype": "bfloat16", "out_dtype": "bfloat16", "scaled": False}
    assert convert_stored_key("tiletune.gemm", new) == new  # idempotent
    assert convert_stored_key("tiletune.rms_norm", gemm_old) == gemm_old  # other ops keep their keys
    att = [{"contiguous": True, "dtype": "bfloat16", "shape": [1, 32, 1500, 128]}] * 4 + [True, {"type": "float"}]
    assert convert_stored_key("tiletune.attention", att) is None  # 1500 is no bucket's top: dropped
    assert convert_stored_key("tiletune.decode_attention", gemm_old) is None


def test_tune_model_builds_the_layer_calls(monkeypatch):
    from typer.testing import CliRunner

    from tiletune import cli

    seen = []

    def fake_run(calls, **kw):
        seen.extend(calls)
        return fill.FillReport()

    monkeypatch.setattr(fill, "run_calls", fake_run)
    r = CliRunner().invoke(cli.app, ["tune", "--model", LLAMA, "--phase", "decode", "--batch", "16",
                                     "--cache", "4096-8192", "--device", "meta"])
    assert r.exit_code == 0, r.output
    assert [c.describe() for c in seen] == [c.describe() for c in fill.layer_calls(LLAMA, "decode", 16, (4096, 8192))]
    bad = CliRunner().invoke(cli.app, ["tune", "--model", LLAMA, "--batch", "0-3"])
    assert bad.exit_code != 0 and "--batch" in bad.output


def test_the_gpu_warm_test_shapes_are_covered_by_its_tune_command():
    """tests/test_gpu_warm_model.py tunes these ranges and then runs these shapes: every key is warmed."""
    calls = fill.layer_calls(LLAMA, "prefill", 1, (33, 64)) + fill.layer_calls(LLAMA, "decode", 1, (300, 512))
    warmed = {k for c in calls for k in _call_keys(c)}
    need = set(fill.layer_keys(LLAMA, "prefill", 1, 50)) | set(fill.layer_keys(LLAMA, "decode", 1, 400))
    assert not need - warmed
    assert len(calls) == 17


def test_the_library_keys_exact_form_differs_only_in_the_bucketed_sizes():
    """What a nearest-neighbour source measures from (``ProblemKey.exact_key_json``): the same names and
    flags as the stored key, the call's own sizes where the key holds their buckets."""
    from types import SimpleNamespace as T

    from tiletune.kernels.attention_op import attention_problem
    from tiletune.kernels.decode_attention_op import DECODE_KEY
    from tiletune.kernels.gemm import GEMM_BUCKETS
    from tiletune.kernels.rope import rope_problem

    bf = torch.bfloat16
    gemm_args = (T(shape=(1, 1058, 3584), dtype=bf), T(shape=(1, 4608, 3584), dtype=bf), T(shape=(1, 1058, 4608), dtype=bf),
                 None, None, False, True, False)
    stored, exact = GEMM_BUCKETS.key_json(gemm_args)[1], GEMM_BUCKETS.exact_key_json(gemm_args)[1]
    assert stored["M"] == 2048 and exact["M"] == 1058
    assert {k: v for k, v in stored.items() if k != "M"} == {k: v for k, v in exact.items() if k != "M"}
    decode_args = (T(shape=(12, 8, 4, 1, 128), dtype=bf), T(shape=(12, 8, 5000, 128), dtype=bf), None, None, True, None)
    stored, exact = DECODE_KEY.key_json(decode_args)[1], DECODE_KEY.exact_key_json(decode_args)[1]
    assert (stored["batch"], stored["kv_len"], exact["batch"], exact["kv_len"]) == (16, 8192, 12, 5000)
    attn = (T(shape=(3, 32, 1500, 128), dtype=bf), T(shape=(3, 8, 1500, 128), dtype=bf), None, None, True)
    assert attention_problem(attn)["q_len"] == 2048 and attention_problem(attn, exact=True)["q_len"] == 1500
    assert attention_problem(attn, exact=True)["batch_heads"] == 96
    rope = (T(shape=(3, 500, 32, 64), dtype=bf), None, T(shape=(3, 500, 8, 64), dtype=bf), None, T(shape=(1, 500, 64), dtype=bf))
    assert rope_problem(rope)["tokens"] == 2048 and rope_problem(rope, exact=True)["tokens"] == 1500
