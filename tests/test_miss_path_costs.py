"""The work a miss does on the CPU, counted: what depends only on the op, its space or the architecture is
done once, and what a space enumerates costs no more than it must (no GPU)."""

from __future__ import annotations

import pickle

from tiletune.space.spaces import Config, Space


def _space() -> Space:
    return Space(TM=[16, 32, 64, 128], TN=[16, 32, 64, 128], occupancy=[1, 2],
                 constraints={"area": lambda c: c.TM * c.TN <= 64 * 64, "wide": lambda c: c.TN >= c.TM},
                 baseline=dict(TM=32, TN=32, occupancy=1))


def test_constraints_read_parameters_without_the_getattr_fallback(monkeypatch):
    calls = []
    fallback = Config.__getattr__

    def counted(self, name):
        calls.append(name)
        return fallback(self, name)

    monkeypatch.setattr(Config, "__getattr__", counted)
    configs = _space().configs("sm_90")
    assert configs and all(c.TM * c.TN <= 64 * 64 and c.TN >= c.TM for c in configs)
    assert calls == []  # every parameter read was an instance attribute
    cfg = configs[0]
    try:
        cfg.NOPE
    except AttributeError as exc:
        assert "has no parameter 'NOPE'" in str(exc)
    assert calls == ["NOPE"]  # a missing one still gets the message
    assert cfg.keys() == ("TM", "TN", "occupancy") and cfg.get("TM") == cfg.TM


def test_configs_a_constraint_drops_are_never_hashed(monkeypatch):
    made = []
    build = Config._build.__func__

    def recording(cls, names, values, hints):
        cfg = build(cls, names, values, hints)
        made.append(cfg)
        return cfg

    space = _space()
    monkeypatch.setattr(Config, "_build", classmethod(recording))
    kept = space.configs("sm_90")
    assert len(made) == 32
    hashed = [c for c in made if c._hash is not None]
    assert len(hashed) == len(kept)  # the survivors (indexed by the space); the dropped ones never
    assert {c.as_dict()["TM"] for c in hashed} == {c.TM for c in kept}


def test_lazily_keyed_configs_compare_hash_and_pickle_as_before():
    a = Config.from_dict({"X": 1, "Y": True})
    b = Config.from_dict({"X": 1.0, "Y": True})
    c = Config.from_dict({"X": 1, "Y": 1})
    assert a == b and hash(a) == hash(b)  # 1 == 1.0
    assert a != c  # True is not 1
    assert len({a, b, c}) == 2
    back = pickle.loads(pickle.dumps(a))
    assert back == a and hash(back) == hash(a) and back.X == 1 and back.hints == {}
    assert a.replace(X=2) == Config.from_dict({"X": 2, "Y": True})


def test_a_config_whose_names_shadow_its_attributes_reads_them_as_before():
    odd = Config._build(("keys", "TM"), (3, 4), frozenset())  # unchecked names (only Space-checked ones are made)
    assert odd.keys() == ("keys", "TM")  # the method, as before; the value through the mapping
    assert odd["keys"] == 3 and odd.TM == 4


def test_config_from_asks_the_enumeration_not_a_set_of_every_candidate(monkeypatch):
    from tiletune.resolve.problem import OpSpec

    outside = Space(TM=[16, 32, 64], constraints={"small": lambda c: c.TM <= 32}, baseline=dict(TM=32))
    spec = OpSpec(name="t", plan=lambda cfg: None, space=outside)
    listed = []
    real = Space.candidates
    monkeypatch.setattr(Space, "candidates", lambda self, arch=None: listed.append(arch) or real(self, arch))
    assert spec.config_from({"TM": 16}, "sm_90") == Config.from_dict({"TM": 16})
    assert spec.config_from({"TM": 32}, "sm_90") == outside.baseline("sm_90")
    assert spec.config_from({"TM": 64}, "sm_90") is None  # breaks the constraint
    assert spec.config_from({"TM": 8}, "sm_90") is None
    assert spec.config_from({"TM": True}, "sm_90") is None
    assert listed == []
    assert outside.is_candidate(outside.baseline("sm_90"), "sm_90")  # candidates() lists the baseline first
    assert [outside.is_candidate(c, "sm_90") for c in real(outside, "sm_90")] == [True, True]
    assert not outside.is_candidate(Config.from_dict({"TM": 8}), "sm_90")


def test_the_front_end_cache_key_reads_only_cutiles_variables(monkeypatch):
    import os

    from tiletune.devices import frontend_cache

    monkeypatch.setenv("CUDA_TILE_OPT_LEVEL", "2")
    monkeypatch.setenv("EXPERIMENTAL_CUDA_TILE_X", "1")
    monkeypatch.setenv("CUDA_TILE_CACHE_DIR", "/somewhere")  # neutral: not part of the key
    monkeypatch.setenv("UNRELATED_VARIABLE", "y")
    read = []

    class Watched(type(os.environ)):
        def __getitem__(self, key):
            read.append(key)
            return super().__getitem__(key)

    watched = Watched(os.environ._data, os.environ.encodekey, os.environ.decodekey, os.environ.encodevalue,
                      os.environ.decodevalue)
    monkeypatch.setattr(frontend_cache.os, "environ", watched)
    want = sorted((k, v) for k, v in os.environ.items()
                  if (k.startswith("CUDA_TILE_") or k.startswith("EXPERIMENTAL_CUDA_TILE_"))
                  and k not in frontend_cache._NEUTRAL_ENV)
    read.clear()
    assert frontend_cache._tile_env() == want == [("CUDA_TILE_OPT_LEVEL", "2"), ("EXPERIMENTAL_CUDA_TILE_X", "1")]
    assert sorted(read) == ["CUDA_TILE_OPT_LEVEL", "EXPERIMENTAL_CUDA_TILE_X"]  # no other value decoded


def test_the_background_warm_reads_every_library_identity_source_once(monkeypatch):
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("cuda.tile")
    import tiletune.identity as identity
    import tiletune.kernels as K
    from tiletune.kernels import decode_attention_op, gemm, norms  # noqa: F401 - their ops are made on import
    from tiletune.kernels.gemm_kernels import gemm_kernel, gemm_splitk_kernel, gemm_swap_kernel
    from tiletune.kernels.library_op import LibraryOp

    monkeypatch.setenv("TILETUNE_TABLES", "1")
    K.warm_first_miss()
    read = []
    real = identity._function_source
    monkeypatch.setattr(identity, "_function_source", lambda fn: read.append(fn) or real(fn))
    for lib in LibraryOp.instances():
        identity.function_source(lib.plan)
    for k in (gemm_kernel, gemm_splitk_kernel, gemm_swap_kernel):
        identity.function_source(k._pyfunc)
    assert read == []  # every plan and kernel an identity hashes was read by the warm
    from tiletune.resolve import tables

    assert tables._loaded is not None  # and the tables
