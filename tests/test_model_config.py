"""``tiletune tune --model``: a model by name or by its Hugging Face ``config.json``.

A model with no preset (another size of a family, a fine-tune with its own vocabulary) is warmed from the
``config.json`` downloaded beside its weights: the layer's dimensions are read from the file, and the calls
(hence the keys) are those of a preset with the same dimensions.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tiletune import cli
from tiletune.lab import fill

#: config.json fields as Hugging Face writes them (abridged: the fields the layer's shapes come from, and some
#: that are not read)
LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
             "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16"}
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
             "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
             "vocab_size": 152064, "rope_theta": 1000000.0}  # no head_dim: 3584 / 28


def write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def test_a_config_gives_the_dimensions_of_the_matching_preset(tmp_path):
    assert fill.model_dims(str(write(tmp_path, LLAMA_70B))) == fill.MODEL_SHAPES["llama3-70b"]
    assert fill.hf_config_dims(write(tmp_path, QWEN25_7B, "q.json")) == fill.MODEL_SHAPES["qwen2.5-7b"]


def test_a_folder_holding_the_config_and_size_options_over_it(tmp_path):
    write(tmp_path, QWEN25_7B)
    assert fill.model_dims(str(tmp_path)) == fill.MODEL_SHAPES["qwen2.5-7b"]
    assert fill.model_dims(str(tmp_path), vocab=32000, hidden=None)["vocab"] == 32000


def test_defaults_as_transformers_takes_them_and_a_nested_text_config(tmp_path):
    mha = {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16, "vocab_size": 32000}
    assert fill.hf_config_dims(write(tmp_path, mha)) == dict(hidden=2048, intermediate=5632, heads=16, kv_heads=16,
                                                             head_dim=128, vocab=32000)
    nested = {"model_type": "llava", "vision_config": {"hidden_size": 1024}, "text_config": dict(LLAMA_70B)}
    assert fill.hf_config_dims(write(tmp_path, nested, "n.json")) == fill.MODEL_SHAPES["llama3-70b"]


@pytest.mark.parametrize("change, words", [
    ({"num_attention_heads": None}, "no num_attention_heads"),
    ({"intermediate_size": None}, "no intermediate_size"),
    ({"vocab_size": 0}, "vocab_size must be a positive integer, got 0"),
    ({"hidden_size": True}, "hidden_size must be a positive integer, got True"),
    ({"num_key_value_heads": 3}, "28 query heads are not a multiple of 3 key/value heads"),
    ({"hidden_size": 3580}, "no head_dim, and hidden_size 3580 is not a multiple of 28 heads"),
    ({"head_dim": "128"}, "head_dim must be a positive integer, got '128'"),
])
def test_a_config_that_cannot_give_the_layer_says_which_field(tmp_path, change, words):
    cfg = {**QWEN25_7B, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(ValueError, match="config.json: " + words.replace("(", r"\(")):
        fill.hf_config_dims(write(tmp_path, cfg))


def test_unreadable_configs_and_unknown_names(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON config"):
        fill.model_dims(str(bad))
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object, got list"):
        fill.model_dims(str(tmp_path))
    with pytest.raises(ValueError, match="no such file, and the Hugging Face cache .* holds no download of "
                                         "'meta-llama/Llama-3.1-8B'"):
        fill.model_dims("meta-llama/Llama-3.1-8B")
    with pytest.raises(ValueError, match="unknown model 'gpt-5'; choose from llama3-8b, .*config.json"):
        fill.model_dims("gpt-5")
    with pytest.raises(ValueError, match="unknown model"):
        fill.model_dims("x\0y")


def test_a_hub_id_is_read_from_the_hugging_face_cache(tmp_path, monkeypatch):
    """``org/name`` of a model downloaded with huggingface_hub: the snapshot ``refs/main`` names, no network."""
    hub = tmp_path / "hf" / "hub"
    folder = hub / "models--Qwen--Qwen2.5-7B-Instruct"
    for rev, cfg in (("aaa", LLAMA_70B), ("bbb", QWEN25_7B)):
        (folder / "snapshots" / rev).mkdir(parents=True)
        write(folder / "snapshots" / rev, cfg)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("bbb\n")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert fill.model_dims("Qwen/Qwen2.5-7B-Instruct") == fill.MODEL_SHAPES["qwen2.5-7b"]
    (folder / "refs" / "main").write_text("gone")  # a ref without its snapshot: the newest snapshot
    import os

    os.utime(folder / "snapshots" / "aaa" / "config.json", (2e9, 2e9))
    assert fill.model_dims("Qwen/Qwen2.5-7B-Instruct") == fill.MODEL_SHAPES["llama3-70b"]
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))  # HF_HUB_CACHE first
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    assert fill.hub_config("Qwen/Qwen2.5-7B-Instruct") is not None
    assert fill.hub_config("Qwen/not-downloaded") is None


def test_tune_model_from_a_config_warms_the_presets_keys(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("cuda.tile")
    seen: list = []

    def fake_run(calls, **kw):
        seen.append(calls)
        return fill.FillReport()

    monkeypatch.setattr(fill, "run_calls", fake_run)
    args = ["--phase", "decode", "--batch", "4", "--cache", "1024", "--device", "meta"]
    for model in (str(write(tmp_path, QWEN25_7B)), "qwen2.5-7b"):
        r = CliRunner().invoke(cli.app, ["tune", "--model", model, *args])
        assert r.exit_code == 0, r.output
        assert f"{model}: hidden 3584, intermediate 18944, heads 28/4, head dim 128, vocab 152064: " in r.output
    by_config, by_name = ([c.describe() for c in calls] for calls in seen)
    assert by_config == by_name and by_config


def test_tune_model_with_a_bad_config_is_one_line_naming_the_field(tmp_path):
    p = write(tmp_path, {k: v for k, v in QWEN25_7B.items() if k != "vocab_size"})
    for argv in (["tune", "--model", str(p)], ["tune", "rms_norm", "--model", str(p)]):
        r = CliRunner().invoke(cli.app, argv)
        assert r.exit_code == 2, r.output
        assert "no vocab_size" in r.output and "Traceback" not in r.output


def test_the_help_names_every_preset():
    r = CliRunner().invoke(cli.app, ["tune", "--help"], terminal_width=400)
    text = " ".join(r.output.replace("│", " ").split())
    for name in fill.MODEL_SHAPES:
        assert name in text, name
