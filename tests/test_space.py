"""Tests of tiletune.space.spaces: parameter checks, per-arch values, hints, constraints, enumeration,
baselines, Config, hashing and the helpers for search strategies. CPU only."""

from __future__ import annotations

import copy
import functools
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tiletune.errors import SpaceError
from tiletune.records import Measurement, Status, stable_hash
from tiletune.space.spaces import HINT_NAMES, KNOWN_ARCHS, Config, PerArch, Space, per_arch

SRC = str(Path(__file__).resolve().parents[1] / "src")


def gemm_space(**overrides: object) -> Space:
    """The space from the module documentation."""
    kwargs: dict = dict(
        TM=[64, 128, 256],
        TN=[64, 128, 256],
        TK=[32, 64],
        occupancy=per_arch(sm_90=[1, 2], sm_100=[1, 2, 4], default=[1]),
        num_ctas=per_arch(sm_100=[1, 2], default=[1]),
        constraints={"tile_fits": lambda c: c.TM * c.TN <= 128 * 256},
        baseline=dict(TM=128, TN=128, TK=64, occupancy=1, num_ctas=1),
    )
    kwargs.update(overrides)
    return Space(**kwargs)


# --------------------------------------------------------------------------------------------
# 1. parameter definitions
# --------------------------------------------------------------------------------------------


def test_parameter_order_is_definition_order() -> None:
    s = Space(Z=[1], A=[2], M=[3])
    assert s.names == ("Z", "A", "M")
    assert s.configs()[0].keys() == ("Z", "A", "M")


def test_tuple_values_accepted_and_stored() -> None:
    s = Space(TM=(64, 128))
    assert s.values("TM") == (64, 128)
    assert [c.TM for c in s.configs()] == [64, 128]


def test_scalar_instead_of_list_is_refused_naming_parameter_and_type() -> None:
    with pytest.raises(SpaceError) as ei:
        Space(TM=64)
    msg = str(ei.value)
    assert "'TM'" in msg and "int" in msg


@pytest.mark.parametrize("bad", [{64, 128}, "64", range(3), {"a": 1}])
def test_non_list_containers_refused(bad: object) -> None:
    with pytest.raises(SpaceError, match="'TK'.*list or tuple"):
        Space(TK=bad)


def test_empty_values_refused() -> None:
    with pytest.raises(SpaceError, match="'TM'.*no values"):
        Space(TM=[])


def test_duplicate_value_refused_naming_it() -> None:
    with pytest.raises(SpaceError) as ei:
        Space(TM=[64, 128, 64])
    assert "'TM'" in str(ei.value) and "duplicate value 64" in str(ei.value)


def test_int_and_equal_float_are_duplicates_but_bool_is_not() -> None:
    with pytest.raises(SpaceError, match="duplicate"):
        Space(x=[1, 1.0])
    s = Space(x=[1, True])
    assert [c.x for c in s.configs()] == [1, True]
    assert type(s.configs()[1].x) is bool


@pytest.mark.parametrize("bad", [[1, [2]], [object()], [{"a": 1}], [float("nan")], [float("inf")]])
def test_non_json_scalar_values_refused(bad: list) -> None:
    with pytest.raises(SpaceError, match="'TM'"):
        Space(TM=bad)


def test_json_scalars_of_every_kind_accepted() -> None:
    s = Space(a=[1, 2.5, "row", True, None])
    assert s.values("a") == (1, 2.5, "row", True, None)


def test_numpy_scalars_are_converted_to_python() -> None:
    np = pytest.importorskip("numpy")
    s = Space(TM=list(np.array([64, 128], dtype=np.int64)), f=[np.float32(0.5)])
    assert s.values("TM") == (64, 128)
    assert all(type(v) is int for v in s.values("TM"))
    assert type(s.values("f")[0]) is float


@pytest.mark.parametrize("name", ["_TM", "__x", "1TM", "T-M", "class", "lambda"])
def test_bad_parameter_names_refused(name: str) -> None:
    with pytest.raises(SpaceError) as ei:
        Space(**{name: [1]})
    assert repr(name) in str(ei.value)


@pytest.mark.parametrize(
    "name", ["keys", "items", "values", "get", "as_dict", "constants", "hash_hex", "replace", "from_dict", "arch"]
)
def test_names_clashing_with_config_attributes_refused(name: str) -> None:
    with pytest.raises(SpaceError, match=f"'{name}'.*clashes"):
        Space(**{name: [1]})


@pytest.mark.parametrize("name", ["hints", "hint_names", "keys"])
def test_config_refuses_reserved_names(name: str) -> None:
    # ("hints" cannot even reach Space's parameters: it is one of Space's keywords)
    with pytest.raises(SpaceError, match=f"'{name}'.*clashes"):
        Config.from_dict({name: 1})


def test_space_without_parameters_refused() -> None:
    with pytest.raises(SpaceError, match="at least one parameter"):
        Space()


# --------------------------------------------------------------------------------------------
# 2. PerArch
# --------------------------------------------------------------------------------------------


def test_known_archs() -> None:
    assert KNOWN_ARCHS == ("sm_80", "sm_90", "sm_100", "sm_120")


def test_per_arch_resolve_and_default() -> None:
    p = per_arch(sm_90=[1, 2], sm_100=[1, 2, 4], default=[1])
    assert isinstance(p, PerArch)
    assert p.resolve("sm_90") == [1, 2]
    assert p.resolve("sm_100") == [1, 2, 4]
    assert p.resolve("sm_80") == [1]
    assert p.resolve(None) == [1]
    assert p.archs == ("sm_90", "sm_100")
    assert p.default == [1] and p.has_default


def test_per_arch_without_default_raises_for_missing_arch() -> None:
    p = PerArch(sm_90=[1, 2])
    assert p.resolve("sm_90") == [1, 2]
    with pytest.raises(SpaceError, match="sm_80.*no default"):
        p.resolve("sm_80")
    with pytest.raises(SpaceError, match="no default"):
        p.resolve(None)
    assert not p.covers("sm_80") and p.covers("sm_90")


@pytest.mark.parametrize("key", ["sm90", "gfx90a", "SM_90", "sm_", "sm_90a", "compute_90"])
def test_per_arch_refuses_bad_arch_keys(key: str) -> None:
    with pytest.raises(SpaceError) as ei:
        PerArch(default=[1], **{key: [1]})
    assert repr(key) in str(ei.value)


def test_per_arch_accepts_any_sm_number() -> None:
    assert PerArch(sm_89=[1]).resolve("sm_89") == [1]


def test_empty_per_arch_refused() -> None:
    with pytest.raises(SpaceError, match="at least one"):
        per_arch()


def test_per_arch_is_immutable_and_compares_by_content() -> None:
    p = per_arch(sm_90=[1], default=[2])
    with pytest.raises(AttributeError):
        p._default = [3]  # type: ignore[misc]
    assert p == per_arch(sm_90=[1], default=[2])
    assert p != per_arch(sm_90=[1], default=[3])
    assert repr(p) == "per_arch(sm_90=[1], default=[2])"


def test_per_arch_values_are_checked_naming_the_arch() -> None:
    with pytest.raises(SpaceError) as ei:
        Space(TM=per_arch(sm_90=[64, 64], default=[64]))
    assert "'TM'" in str(ei.value) and "sm_90" in str(ei.value) and "duplicate" in str(ei.value)
    with pytest.raises(SpaceError, match="'TM'.*default.*list or tuple"):
        Space(TM=per_arch(sm_90=[64], default=64))


def test_per_arch_resolution_in_enumeration() -> None:
    s = gemm_space()
    # 3x3 tiles minus (256, 256) = 8 tile pairs, 2 TK
    assert s.size("sm_90") == 8 * 2 * 2 * 1
    assert s.size("sm_100") == 8 * 2 * 3 * 2
    assert s.size("sm_80") == 8 * 2
    assert s.size("sm_120") == 8 * 2
    assert s.size(None) == 8 * 2
    assert {c.occupancy for c in s.configs("sm_100")} == {1, 2, 4}
    assert {c.num_ctas for c in s.configs("sm_90")} == {1}
    assert s.values("occupancy", "sm_90") == (1, 2)
    assert s.archs == ("sm_90", "sm_100")


def test_arch_capability_tuple_accepted() -> None:
    s = gemm_space()
    assert s.configs((9, 0)) == s.configs("sm_90")


def test_invalid_arch_argument_refused() -> None:
    with pytest.raises(SpaceError, match="'hopper'"):
        gemm_space().configs("hopper")


def test_param_without_values_for_arch_raises() -> None:
    s = Space(TM=[64], occupancy=per_arch(sm_90=[1, 2]))
    assert s.size("sm_90") == 2
    with pytest.raises(SpaceError, match="'occupancy'.*sm_80"):
        s.configs("sm_80")
    with pytest.raises(SpaceError, match="'occupancy'.*without a default"):
        s.configs(None)


# --------------------------------------------------------------------------------------------
# 3. hints
# --------------------------------------------------------------------------------------------


def test_hint_names() -> None:
    assert HINT_NAMES == ("occupancy", "num_ctas", "opt_level", "num_worker_warps")


def test_hints_and_constants_split() -> None:
    s = gemm_space()
    cfg = s.candidates("sm_90")[0]
    assert cfg.hints == {"occupancy": 1, "num_ctas": 1}
    assert cfg.constants == {"TM": 128, "TN": 128, "TK": 64}
    assert s.hint_names == ("occupancy", "num_ctas")
    assert s.constant_names == ("TM", "TN", "TK")


def test_extra_hints_keyword() -> None:
    s = Space(TM=[64], my_hint=[3], hints=["my_hint"])
    cfg = s.configs()[0]
    assert cfg.hints == {"my_hint": 3}
    assert cfg.constants == {"TM": 64}
    assert s.hint_names == ("my_hint",)


def test_extra_hints_must_be_parameters() -> None:
    with pytest.raises(SpaceError, match="'nope'"):
        Space(TM=[64], hints=["nope"])
    with pytest.raises(SpaceError, match="list of parameter names"):
        Space(TM=[64], hints="TM")


@pytest.mark.parametrize(
    "name, good, bad",
    [
        ("occupancy", [1, 2, 32], [0, 33, -1, 1.0, True, "2"]),
        ("num_ctas", [1, 2, 4, 8, 16], [0, 3, 32, 2.0, None]),
        ("opt_level", [0, 1, 2, 3], [-1, 4, 3.0]),
        ("num_worker_warps", [1, 2, 4, 8, 16, 32], [0, 3, 6, 64, 4.0]),
    ],
)
def test_hint_values_validated(name: str, good: list, bad: list) -> None:
    s = Space(**{name: good})
    assert list(s.values(name)) == good
    for v in bad:
        with pytest.raises(SpaceError) as ei:
            Space(**{name: [good[0], v]})
        assert repr(name) in str(ei.value) and repr(v) in str(ei.value)


def test_per_arch_hint_values_validated() -> None:
    with pytest.raises(SpaceError, match="sm_100.*'num_ctas'"):
        Space(num_ctas=per_arch(sm_100=[1, 3], default=[1]))
    with pytest.raises(SpaceError, match="default.*'occupancy'"):
        Space(occupancy=per_arch(sm_100=[1], default=[0]))


# --------------------------------------------------------------------------------------------
# 4. constraints
# --------------------------------------------------------------------------------------------


def small_even(c: Config) -> bool:
    return c.x % 2 == 0


def test_constraint_names_from_list_and_dict() -> None:
    s = Space(x=[1, 2, 3, 4], constraints=[small_even, lambda c: c.x > 0, lambda c: True])
    assert s.constraint_names == ("small_even", "constraint #1", "constraint #2")
    s2 = Space(x=[1, 2], constraints={"a": lambda c: True, "b": small_even})
    assert s2.constraint_names == ("a", "b")


def test_duplicate_function_names_are_made_unique() -> None:
    s = Space(x=[2, 4], constraints=[small_even, small_even])
    assert s.constraint_names == ("small_even", "small_even #1")


def test_constraints_filter_in_order() -> None:
    s = Space(x=[1, 2, 3, 4, 5, 6], constraints=[small_even, lambda c: c.x < 5])
    assert [c.x for c in s.configs()] == [2, 4]


def test_single_callable_constraint_accepted() -> None:
    s = Space(x=[1, 2, 3, 4], constraints=small_even)
    assert [c.x for c in s.configs()] == [2, 4]


def test_non_callable_constraint_refused() -> None:
    with pytest.raises(SpaceError, match="'bad'.*not callable"):
        Space(x=[1], constraints={"bad": 3})
    with pytest.raises(SpaceError, match="list of callables"):
        Space(x=[1], constraints=3)


def test_raising_constraint_reported_with_name_and_config() -> None:
    def boom(c: Config) -> bool:
        return 1 / (c.x - 2) > 0

    s = Space(x=[3, 2], constraints=[boom])
    with pytest.raises(SpaceError) as ei:
        s.configs()
    msg = str(ei.value)
    assert "'boom'" in msg and "Config(x=2)" in msg and "ZeroDivisionError" in msg
    assert isinstance(ei.value.__cause__, ZeroDivisionError)


def test_constraint_with_typo_attribute_reported() -> None:
    s = Space(x=[1], constraints={"typo": lambda c: c.y > 0})
    with pytest.raises(SpaceError, match="'typo'.*AttributeError.*'y'"):
        s.configs()


# --------------------------------------------------------------------------------------------
# 5. enumeration
# --------------------------------------------------------------------------------------------


def test_product_order_last_parameter_fastest() -> None:
    s = Space(a=[1, 2], b=["x", "y", "z"])
    assert [(c.a, c.b) for c in s.configs()] == [
        (1, "x"), (1, "y"), (1, "z"), (2, "x"), (2, "y"), (2, "z"),
    ]


def test_configs_of_gemm_space_respect_constraint() -> None:
    s = gemm_space()
    cfgs = s.configs("sm_90")
    assert all(c.TM * c.TN <= 128 * 256 for c in cfgs)
    assert not any(c.TM == 256 and c.TN == 256 for c in cfgs)
    assert cfgs[0] == Config({"TM": 64, "TN": 64, "TK": 32, "occupancy": 1, "num_ctas": 1})
    assert cfgs[1] == Config({"TM": 64, "TN": 64, "TK": 32, "occupancy": 2, "num_ctas": 1})
    assert len(set(cfgs)) == len(cfgs) == 32


def test_empty_space_names_the_emptying_constraint() -> None:
    s = Space(
        x=[1, 2, 3, 4],
        constraints={"positive": lambda c: c.x > 0, "even": small_even, "huge": lambda c: c.x > 100,
                     "never_reached": lambda c: True},
    )
    with pytest.raises(SpaceError) as ei:
        s.configs("sm_90")
    msg = str(ei.value)
    assert "'huge'" in msg
    assert "removed all 2 remaining" in msg
    assert "4 in the product" in msg
    assert "sm_90" in msg
    assert "never_reached" not in msg and "'even'" not in msg


def test_empty_space_first_constraint() -> None:
    s = Space(x=[1, 3], constraints=[small_even])
    with pytest.raises(SpaceError, match="'small_even' removed all 2 remaining"):
        s.size()


def test_enumeration_is_cached_per_arch() -> None:
    calls = []

    def counting(c: Config) -> bool:
        calls.append(c.x)
        return True

    s = Space(x=[1, 2, 3], y=per_arch(sm_90=[1, 2], default=[1]), constraints=[counting])
    s.configs("sm_90")
    assert len(calls) == 6
    s.configs("sm_90")
    s.candidates("sm_90")
    s.size("sm_90")
    assert len(calls) == 6
    s.configs("sm_80")
    assert len(calls) == 9
    first = s.configs("sm_90")
    first.clear()  # the returned list is a copy
    assert s.size("sm_90") == 6


# --------------------------------------------------------------------------------------------
# 6. baseline
# --------------------------------------------------------------------------------------------


def test_candidates_put_baseline_first_without_duplicate() -> None:
    s = gemm_space()
    cands = s.candidates("sm_90")
    base = Config({"TM": 128, "TN": 128, "TK": 64, "occupancy": 1, "num_ctas": 1})
    assert cands[0] == base
    assert cands.count(base) == 1
    assert len(cands) == s.size("sm_90")
    rest = [c for c in s.configs("sm_90") if c != base]
    assert cands[1:] == rest
    assert s.baseline("sm_90") == base


def test_candidates_without_baseline_equal_configs() -> None:
    s = gemm_space(baseline=None)
    assert s.baseline("sm_90") is None
    assert s.candidates("sm_90") == s.configs("sm_90")


def test_baseline_missing_and_unknown_names_listed() -> None:
    with pytest.raises(SpaceError) as ei:
        gemm_space(baseline=dict(TM=128, TN=128, TK=64, occupancy=1, bogus=3))
    msg = str(ei.value)
    assert "'bogus'" in msg and "missing" in msg and "'num_ctas'" in msg


def test_baseline_value_not_in_default_values() -> None:
    with pytest.raises(SpaceError) as ei:
        gemm_space(baseline=dict(TM=96, TN=128, TK=64, occupancy=1, num_ctas=1))
    assert "'TM'" in str(ei.value) and "96" in str(ei.value)


def test_baseline_value_checked_against_named_arch() -> None:
    with pytest.raises(SpaceError) as ei:
        Space(TM=per_arch(sm_90=[64], default=[64, 128]), baseline=dict(TM=128))
    assert "'TM'" in str(ei.value) and "sm_90" in str(ei.value)


def test_baseline_hint_only_valid_on_some_arch_is_refused() -> None:
    # occupancy=2 exists on sm_90 and sm_100 but not in the default values
    with pytest.raises(SpaceError, match="'occupancy'.*default"):
        gemm_space(baseline=dict(TM=128, TN=128, TK=64, occupancy=2, num_ctas=1))


def test_baseline_violating_constraint_refused() -> None:
    with pytest.raises(SpaceError, match="baseline.*'tile_fits'"):
        gemm_space(baseline=dict(TM=256, TN=256, TK=64, occupancy=1, num_ctas=1))


def test_baseline_skips_param_without_default_in_default_check() -> None:
    s = Space(TM=[64, 128], occupancy=per_arch(sm_90=[1, 2], sm_100=[2, 4]), baseline=dict(TM=64, occupancy=2))
    assert s.candidates("sm_90")[0] == s.config("sm_90", TM=64, occupancy=2)
    assert s.candidates("sm_100")[0].as_dict() == {"TM": 64, "occupancy": 2}
    with pytest.raises(SpaceError, match="sm_100"):
        Space(TM=[64], occupancy=per_arch(sm_90=[1, 2], sm_100=[2, 4]), baseline=dict(TM=64, occupancy=1))


def test_per_arch_baseline() -> None:
    s = gemm_space(
        baseline=per_arch(
            sm_100=dict(TM=128, TN=256, TK=64, occupancy=4, num_ctas=2),
            default=dict(TM=128, TN=128, TK=64, occupancy=1, num_ctas=1),
        )
    )
    assert s.baseline("sm_100").as_dict() == dict(TM=128, TN=256, TK=64, occupancy=4, num_ctas=2)
    assert s.baseline("sm_90").as_dict() == dict(TM=128, TN=128, TK=64, occupancy=1, num_ctas=1)
    assert s.candidates("sm_100")[0].TN == 256
    assert s.candidates("sm_80")[0].TN == 128


def test_per_arch_baseline_without_default_gives_none_elsewhere() -> None:
    s = gemm_space(baseline=per_arch(sm_90=dict(TM=64, TN=64, TK=32, occupancy=2, num_ctas=1)))
    assert s.baseline("sm_90").occupancy == 2
    assert s.baseline("sm_80") is None
    assert s.candidates("sm_80") == s.configs("sm_80")


def test_per_arch_baseline_entries_checked_for_their_arch() -> None:
    with pytest.raises(SpaceError, match="sm_90.*'occupancy'"):
        gemm_space(baseline=per_arch(sm_90=dict(TM=64, TN=64, TK=32, occupancy=4, num_ctas=1)))
    with pytest.raises(SpaceError, match="'num_ctas'"):
        gemm_space(baseline=per_arch(sm_90=dict(TM=64, TN=64, TK=32, occupancy=1, num_ctas=2)))


def test_baseline_of_wrong_type_refused() -> None:
    with pytest.raises(SpaceError, match="baseline must be a dict"):
        gemm_space(baseline=[128, 128, 64, 1, 1])


# --------------------------------------------------------------------------------------------
# 7. Config
# --------------------------------------------------------------------------------------------


def test_config_access() -> None:
    cfg = gemm_space().candidates("sm_90")[0]
    assert cfg.TM == 128 and cfg["TN"] == 128 and cfg.get("TK") == 64 and cfg.get("nope", 7) == 7
    assert cfg.keys() == ("TM", "TN", "TK", "occupancy", "num_ctas")
    assert cfg.items() == (("TM", 128), ("TN", 128), ("TK", 64), ("occupancy", 1), ("num_ctas", 1))
    assert list(cfg) == ["TM", "TN", "TK", "occupancy", "num_ctas"]
    assert len(cfg) == 5
    assert "TM" in cfg and "XX" not in cfg
    assert dict(cfg) == {"TM": 128, "TN": 128, "TK": 64, "occupancy": 1, "num_ctas": 1}


def test_config_unknown_attribute_lists_names() -> None:
    cfg = Config({"TM": 128, "occupancy": 2})
    with pytest.raises(AttributeError) as ei:
        cfg.TX
    assert "'TX'" in str(ei.value) and "TM, occupancy" in str(ei.value)
    with pytest.raises(KeyError, match="TX"):
        cfg["TX"]


def test_config_repr() -> None:
    assert repr(Config({"TM": 128, "TN": 64, "occupancy": 2})) == "Config(TM=128, TN=64, occupancy=2)"
    assert repr(Config({"layout": "row", "flag": None})) == "Config(layout='row', flag=None)"


def test_config_is_immutable() -> None:
    cfg = Config({"TM": 128})
    with pytest.raises(AttributeError):
        cfg.TM = 64  # type: ignore[misc]
    with pytest.raises(AttributeError):
        cfg.other = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        cfg["TM"] = 64  # type: ignore[index]
    with pytest.raises(AttributeError):
        del cfg.TM
    d = cfg.as_dict()
    d["TM"] = 1
    assert cfg.TM == 128
    assert copy.copy(cfg) is cfg and copy.deepcopy(cfg) is cfg


def test_config_hashable_and_equality() -> None:
    a = Config({"TM": 128, "TN": 64})
    b = Config({"TM": 128, "TN": 64})
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert {a: "x"}[b] == "x"
    assert a != Config({"TM": 128, "TN": 128})
    assert a != Config({"TN": 64, "TM": 128})  # parameter order is part of identity
    assert Config({"f": 1}) != Config({"f": True})
    assert Config({"f": 1}) == Config({"f": 1.0})
    assert a != {"TM": 128, "TN": 64}  # never equal to a plain dict


def test_config_hash_hex_is_stable_hash_of_dict() -> None:
    cfg = Config({"TM": 128, "TN": 64, "occupancy": 2})
    assert cfg.hash_hex == stable_hash({"TM": 128, "TN": 64, "occupancy": 2})
    assert len(cfg.hash_hex) == 16
    m = Measurement(config=cfg, status=Status.OK)
    assert m.config_hash == cfg.hash_hex
    assert cfg.hash_hex != Config({"TM": 128, "TN": 64, "occupancy": 1}).hash_hex


def test_config_replace() -> None:
    cfg = Config({"TM": 128, "occupancy": 2})
    new = cfg.replace(TM=64)
    assert new.as_dict() == {"TM": 64, "occupancy": 2}
    assert new.hints == {"occupancy": 2}
    assert cfg.TM == 128
    with pytest.raises(SpaceError, match="'TX'"):
        cfg.replace(TX=1)


def test_config_from_dict() -> None:
    cfg = Config.from_dict({"TM": 128, "occupancy": 2, "mine": 3})
    assert cfg.hints == {"occupancy": 2}
    cfg2 = Config.from_dict({"TM": 128, "occupancy": 2, "mine": 3}, hint_names=("mine",))
    assert cfg2.hints == {"mine": 3}
    assert cfg2.constants == {"TM": 128, "occupancy": 2}
    assert cfg == cfg2  # equality is by names and values only
    with pytest.raises(SpaceError, match="'_x'"):
        Config.from_dict({"_x": 1})
    with pytest.raises(SpaceError, match="JSON scalar"):
        Config.from_dict({"x": [1]})


def test_space_config_builds_and_validates() -> None:
    s = gemm_space()
    cfg = s.config("sm_100", TM=64, TN=256, TK=32, occupancy=4, num_ctas=2)
    assert cfg.hints == {"occupancy": 4, "num_ctas": 2}
    assert cfg in s.configs("sm_100")
    with pytest.raises(SpaceError, match="'occupancy'.*sm_90"):
        s.config("sm_90", TM=64, TN=256, TK=32, occupancy=4, num_ctas=1)
    with pytest.raises(SpaceError, match="'occupancy'.*default"):
        s.config(TM=64, TN=256, TK=32, occupancy=4, num_ctas=1)
    with pytest.raises(SpaceError, match="unknown parameter.*'bogus'"):
        s.config("sm_90", TM=64, TN=256, TK=32, occupancy=1, num_ctas=1, bogus=1)
    with pytest.raises(SpaceError, match="missing parameter.*'TK'"):
        s.config("sm_90", TM=64, TN=256, occupancy=1, num_ctas=1)
    with pytest.raises(SpaceError, match="'tile_fits'"):
        s.config("sm_90", TM=256, TN=256, TK=32, occupancy=1, num_ctas=1)
    assert s.config(arch="sm_90", TM=64, TN=64, TK=32, occupancy=2, num_ctas=1).occupancy == 2


def test_space_config_accepts_true_only_if_in_space() -> None:
    s = Space(x=[1, 2])
    with pytest.raises(SpaceError, match="'x'"):
        s.config(x=True)


# --------------------------------------------------------------------------------------------
# 8. space hash
# --------------------------------------------------------------------------------------------

HASH_SCRIPT = textwrap.dedent(
    """
    import tiletune.space.spaces as tt
    LIMIT = 128 * 256
    def small(c):
        return c.TK <= c.TM
    space = tt.Space(
        TM=[64, 128, 256], TN=[64, 128, 256], TK=[32, 64],
        occupancy=tt.per_arch(sm_90=[1, 2], sm_100=[1, 2, 4], default=[1]),
        constraints={"tile_fits": lambda c: c.TM * c.TN <= LIMIT, "small": small},
        baseline=dict(TM=128, TN=128, TK=64, occupancy=1),
    )
    print(space.hash, space.candidates("sm_100")[3].hash_hex)
    """
)


def _run_hash_script(tmp_path: Path, seed: str) -> str:
    script = tmp_path / "space_def.py"
    script.write_text(HASH_SCRIPT)
    env = dict(os.environ, PYTHONPATH=SRC, PYTHONHASHSEED=seed)
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    return out.stdout.strip()


def test_hash_identical_across_processes(tmp_path: Path) -> None:
    first = _run_hash_script(tmp_path, "1")
    second = _run_hash_script(tmp_path, "12345")
    space_hash, cfg_hash = first.split()
    assert len(space_hash) == 32 and int(space_hash, 16) >= 0
    assert len(cfg_hash) == 16
    assert first == second


def test_hash_same_for_identical_definitions() -> None:
    def make() -> Space:
        return Space(TM=[64, 128], occupancy=per_arch(sm_90=[1, 2], default=[1]), constraints=[small_even])

    assert make().hash == make().hash
    s = make()
    assert s.hash == s.hash and isinstance(s.hash, str)


def test_hash_changes_with_content() -> None:
    base = dict(TM=[64, 128], occupancy=per_arch(sm_90=[1, 2], default=[1]))
    h = Space(**base).hash
    variants = [
        Space(TM=[64, 256], occupancy=per_arch(sm_90=[1, 2], default=[1])),  # value
        Space(TM=[128, 64], occupancy=per_arch(sm_90=[1, 2], default=[1])),  # value order
        Space(TM=[64, 128], occupancy=per_arch(sm_90=[1, 4], default=[1])),  # per-arch value
        Space(TM=[64, 128], occupancy=per_arch(sm_100=[1, 2], default=[1])),  # per-arch key
        Space(TM=[64, 128], occupancy=[1]),  # plain vs per-arch
        Space(occupancy=per_arch(sm_90=[1, 2], default=[1]), TM=[64, 128]),  # parameter order
        Space(TN=[64, 128], occupancy=per_arch(sm_90=[1, 2], default=[1])),  # name
        Space(**base, baseline=dict(TM=64, occupancy=1)),  # baseline
        Space(**base, constraints=[small_even]),  # constraint added
        Space(TM=[64, 128], x=[1], occupancy=per_arch(sm_90=[1, 2], default=[1])),  # param added
    ]
    hashes = [v.hash for v in variants]
    assert h not in hashes
    assert len(set(hashes)) == len(hashes)
    # hints= changes the hash
    assert Space(TM=[64], x=[1], hints=["x"]).hash != Space(TM=[64], x=[1]).hash
    # baseline value
    assert (
        Space(**base, baseline=dict(TM=64, occupancy=1)).hash
        != Space(**base, baseline=dict(TM=128, occupancy=1)).hash
    )


def test_hash_changes_with_constraint_source_name_and_bound_values() -> None:
    a = Space(x=[1, 2, 3], constraints={"c": lambda c: c.x < 3}).hash
    b = Space(x=[1, 2, 3], constraints={"c": lambda c: c.x < 2}).hash
    renamed = Space(x=[1, 2, 3], constraints={"d": lambda c: c.x < 3}).hash
    assert len({a, b, renamed}) == 3

    def make(limit: int) -> Space:
        return Space(x=[1, 2, 3], constraints={"c": lambda c: c.x < limit})

    assert make(3).hash == make(3).hash
    assert make(3).hash != make(2).hash


def below(c: Config, limit: int) -> bool:
    return c.x < limit


def test_hash_of_partial_constraint_covers_bound_arguments() -> None:
    def make(limit: int) -> Space:
        return Space(x=[1, 2, 3], constraints={"below": functools.partial(below, limit=limit)})

    assert [c.x for c in make(3).configs()] == [1, 2]
    assert make(3).hash == make(3).hash
    assert make(3).hash != make(2).hash


def test_hash_changes_with_constraint_source_across_processes(tmp_path: Path) -> None:
    before = _run_hash_script(tmp_path, "0")
    script = tmp_path / "space_def.py"
    changed = HASH_SCRIPT.replace("c.TK <= c.TM", "c.TK < c.TM")
    assert changed != HASH_SCRIPT
    script.write_text(changed)
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] != before.split()[0]


# --------------------------------------------------------------------------------------------
# 9. helpers for search strategies
# --------------------------------------------------------------------------------------------


def test_sample_distinct_valid_and_deterministic() -> None:
    s = gemm_space()
    got = s.sample(random.Random(7), "sm_100", n=10)
    assert len(got) == 10 and len(set(got)) == 10
    valid = set(s.configs("sm_100"))
    assert all(c in valid for c in got)
    assert got == s.sample(random.Random(7), "sm_100", n=10)
    assert got != s.sample(random.Random(8), "sm_100", n=10)
    assert s.sample(random.Random(0), "sm_100") and len(s.sample(random.Random(0), "sm_100")) == 1
    assert s.sample(random.Random(0), "sm_100", n=0) == []


def test_sample_returns_whole_space_when_n_is_large() -> None:
    s = Space(x=[1, 2, 3, 4], constraints=[small_even])
    got = s.sample(random.Random(0), None, n=100)
    assert sorted(c.x for c in got) == [2, 4]
    with pytest.raises(SpaceError):
        s.sample(random.Random(0), None, n=-1)


def test_neighbours_one_step_in_one_parameter() -> None:
    s = Space(a=[1, 2, 3], b=["x", "y", "z"])
    cfg = s.config(a=2, b="x")
    got = [(c.a, c.b) for c in s.neighbours(cfg)]
    assert got == [(1, "x"), (3, "x"), (2, "y")]
    corner = s.config(a=3, b="z")
    assert [(c.a, c.b) for c in s.neighbours(corner)] == [(2, "z"), (3, "y")]


def test_neighbours_skip_invalid_and_respect_arch() -> None:
    s = gemm_space()
    cfg = s.config("sm_90", TM=128, TN=128, TK=64, occupancy=1, num_ctas=1)
    got = s.neighbours(cfg, "sm_90")
    assert [c.as_dict() for c in got] == [
        dict(TM=64, TN=128, TK=64, occupancy=1, num_ctas=1),
        dict(TM=256, TN=128, TK=64, occupancy=1, num_ctas=1),
        dict(TM=128, TN=64, TK=64, occupancy=1, num_ctas=1),
        dict(TM=128, TN=256, TK=64, occupancy=1, num_ctas=1),
        dict(TM=128, TN=128, TK=32, occupancy=1, num_ctas=1),
        dict(TM=128, TN=128, TK=64, occupancy=2, num_ctas=1),
    ]
    edge = s.config("sm_90", TM=256, TN=128, TK=64, occupancy=1, num_ctas=1)
    assert dict(TM=256, TN=256, TK=64, occupancy=1, num_ctas=1) not in [c.as_dict() for c in s.neighbours(edge, "sm_90")]
    assert all(sum(a != b for a, b in zip(c.values(), edge.values())) == 1 for c in s.neighbours(edge, "sm_90"))
    # on sm_100 num_ctas also has a neighbour
    assert any(c.num_ctas == 2 for c in s.neighbours(cfg, "sm_100"))
    with pytest.raises(SpaceError, match="'occupancy'"):
        s.neighbours(cfg.replace(occupancy=4), "sm_90")


def test_neighbours_accept_plain_dict() -> None:
    s = Space(a=[1, 2, 3])
    assert [c.a for c in s.neighbours({"a": 1})] == [2]


def test_encode() -> None:
    s = Space(TM=[64, 128], f=[0.5, 2.0], layout=["row", "col"], z=[0, 1], flag=[False, True], neg=[-1, 1])
    cfg = s.config(TM=128, f=0.5, layout="col", z=1, flag=True, neg=1)
    assert s.encode(cfg) == [7.0, -1.0, 1.0, 1.0, 1.0, 1.0]
    cfg2 = s.config(TM=64, f=2.0, layout="row", z=0, flag=False, neg=-1)
    assert s.encode(cfg2) == [6.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert all(isinstance(x, float) for x in s.encode(cfg))


def test_encode_uses_arch_values() -> None:
    s = gemm_space()
    cfg = s.config("sm_100", TM=64, TN=256, TK=32, occupancy=4, num_ctas=2)
    assert s.encode(cfg, "sm_100") == [6.0, 8.0, 5.0, 2.0, 1.0]


def test_index_matches_configs_position() -> None:
    s = gemm_space()
    cfgs = s.configs("sm_100")
    for i in (0, 1, 17, len(cfgs) - 1):
        assert s.index(cfgs[i], "sm_100") == i
    assert s.index(cfgs[5].as_dict(), "sm_100") == 5
    with pytest.raises(SpaceError, match="'tile_fits'"):
        s.index(Config(dict(TM=256, TN=256, TK=32, occupancy=1, num_ctas=1)), "sm_100")


# --------------------------------------------------------------------------------------------
# 10. len / repr / immutability of Space
# --------------------------------------------------------------------------------------------


def test_space_has_no_len() -> None:
    with pytest.raises(TypeError):
        len(gemm_space())  # type: ignore[arg-type]


def test_space_repr_shows_params() -> None:
    r = repr(gemm_space())
    assert r.startswith("Space(TM=[64, 128, 256], TN=[64, 128, 256], TK=[32, 64], ")
    assert "occupancy=per_arch(sm_90=[1, 2], sm_100=[1, 2, 4], default=[1])" in r
    assert "constraints=['tile_fits']" in r


def test_space_is_immutable() -> None:
    s = gemm_space()
    with pytest.raises(AttributeError):
        s._params = {}  # type: ignore[misc]
    p = s.params
    p["TM"] = (1,)
    assert s.values("TM") == (64, 128, 256)
