"""Problem keys: the in-memory default key, its stored JSON form, and the JSON form of user keys."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.lab.demo import ShapeOnly
from tiletune.keys import args_key_json, default_key, is_tensor, key_to_json, tensor_json


class Opaque:
    pass


# ---------------------------------------------------------------------------------------------
# default_key


def test_tensor_part_is_shape_strides_dtype_device():
    x = torch.zeros(2, 3, dtype=torch.float16)
    assert default_key((x,)) == (torch.Size([2, 3]), (3, 1), torch.float16, -1)
    t = torch.zeros(3, 2).t()
    assert default_key((t,)) == (torch.Size([2, 3]), (1, 2), torch.float32, -1)
    # several tensors: the device index of the first one closes the key
    assert default_key((x, t)) == (torch.Size([2, 3]), (3, 1), torch.float16, torch.Size([2, 3]), (1, 2),
                                   torch.float32, -1)


def test_tensor_key_ignores_data_but_not_shape_strides_or_dtype():
    x = torch.zeros(2, 3)
    assert default_key((x,)) == default_key((torch.randn(2, 3),))
    assert default_key((x,)) != default_key((torch.zeros(3, 2),))
    assert default_key((x,)) != default_key((torch.zeros(3, 2).t(),))
    assert default_key((x,)) != default_key((torch.zeros(2, 3, dtype=torch.bfloat16),))
    hash(default_key((x, 1, "a")))  # hashable


def test_ints_strings_bools_none_by_value():
    assert default_key((3, "rows", True, None)) == (3, "rows", True, None, None)
    assert default_key((torch.float16,)) != default_key((torch.bfloat16,))
    assert default_key((3,)) != default_key((4,))
    assert default_key(("rows",)) != default_key(("cols",))
    assert type(default_key((True,))[0]) is bool


def test_floats_and_other_objects_by_type_only():
    x = torch.zeros(4)
    assert default_key((x, 1e-6)) == (*default_key((x,))[:3], float, -1)
    assert default_key((x, 1e-6)) == default_key((torch.ones(4), 1e-5))  # an eps change is the same key
    assert default_key((Opaque(),)) == (Opaque, None)
    assert default_key(([1, 2],)) == default_key(([3],)) == (list, None)


def test_duck_typed_tensor_is_keyed_like_a_tensor():
    s = ShapeOnly((4, 8), "bfloat16")
    assert is_tensor(s) and not is_tensor(1.0) and not is_tensor(Opaque())
    assert default_key((s,)) == ((4, 8), (8, 1), "bfloat16", 0)


# ---------------------------------------------------------------------------------------------
# args_key_json / tensor_json


def test_args_key_json_contiguous_tensor_has_no_strides():
    x = torch.zeros(2, 3, dtype=torch.bfloat16)
    assert args_key_json((x,)) == [{"shape": [2, 3], "dtype": "bfloat16", "contiguous": True}]


def test_args_key_json_non_contiguous_tensor_records_strides():
    t = torch.zeros(3, 2, dtype=torch.float16).t()
    assert args_key_json((t,)) == [{"shape": [2, 3], "dtype": "float16", "contiguous": False, "strides": [1, 2]}]
    sliced = torch.zeros(4, 8)[:, :4]
    assert tensor_json(sliced) == {"shape": [4, 4], "dtype": "float32", "contiguous": False, "strides": [8, 1]}


def test_size_one_dims_do_not_break_contiguity():
    # The stride of a size-1 dimension is never used to address memory, so it must not matter. These
    # tensors are contiguous although a size-1 dim's stride differs from the row-major stride (the
    # code path the test is named after: a row slice like zeros(4, 8)[:1] has the row-major stride
    # anyway and would not reach it).
    col = torch.zeros(1, 8).t()  # shape (8, 1), strides (1, 8); row-major would be (1, 1)
    assert col.is_contiguous() and col.stride() == (1, 8)
    assert tensor_json(col) == {"shape": [8, 1], "dtype": "float32", "contiguous": True}
    mid = torch.zeros(2, 1, 3).transpose(0, 1)  # shape (1, 2, 3), strides (3, 3, 1); row-major (6, 3, 1)
    assert mid.is_contiguous() and mid.stride() == (3, 3, 1)
    assert tensor_json(mid) == {"shape": [1, 2, 3], "dtype": "float32", "contiguous": True}
    odd = torch.zeros(8).as_strided((1, 8), (99, 1))
    assert tensor_json(odd)["contiguous"] is True and "strides" not in tensor_json(odd)
    # ...while a size > 1 dimension with the wrong stride still breaks contiguity
    col = torch.zeros(4, 8)[:, :1]  # shape (4, 1), strides (8, 1): not contiguous
    assert tensor_json(col)["contiguous"] is False and tensor_json(col)["strides"] == [8, 1]
    # and a size-1 dim still counts in the strides expected of the dims before it
    assert tensor_json(torch.zeros(4, 1, 8))["contiguous"] is True  # strides (8, 8, 1)
    assert tensor_json(torch.zeros(4, 2, 8)[:, :1])["contiguous"] is False  # strides (16, 8, 1)
    assert tensor_json(torch.zeros(2, 4)[:, :3])["contiguous"] is False  # a size-2 dim's stride counts


def test_zero_size_dims_keep_contiguity_and_stay_in_the_key():
    # an empty dimension does not make the rest of the strides zero
    empty = torch.zeros(3, 0)
    assert tensor_json(empty) == {"shape": [3, 0], "dtype": "float32", "contiguous": True}
    assert tensor_json(torch.zeros(0, 3)) == {"shape": [0, 3], "dtype": "float32", "contiguous": True}
    assert default_key((empty,)) != default_key((torch.zeros(0, 3),))


def test_args_key_json_scalars_floats_and_objects():
    x = torch.zeros(2)
    out = args_key_json((x, 7, "rows", None, True, 1e-6, Opaque()))
    assert out == [
        {"shape": [2], "dtype": "float32", "contiguous": True},
        7,
        "rows",
        None,
        True,
        {"type": "float"},
        {"type": "Opaque"},
    ]
    json.dumps(out)  # storable as is
    assert "torch." not in json.dumps(args_key_json((torch.zeros(1, dtype=torch.int8),)))


def test_args_key_json_of_duck_typed_tensor():
    assert args_key_json((ShapeOnly((4, 8), "bfloat16"),)) == [
        {"shape": [4, 8], "dtype": "bfloat16", "contiguous": True}
    ]


# ---------------------------------------------------------------------------------------------
# key_to_json (user keys)


def test_key_to_json_of_nested_user_keys():
    key = ("mm", 4096, 1.5, True, None, (torch.bfloat16, torch.float32), float, {"k": [1, torch.int8]})
    assert key_to_json(key) == [
        "mm",
        4096,
        1.5,
        True,
        None,
        ["bfloat16", "float32"],
        {"type": "float"},
        {"k": [1, "int8"]},
    ]


def test_key_to_json_of_tensor_and_non_string_dict_keys():
    t = torch.zeros(3, 2).t()
    assert key_to_json({1: t}) == {"1": {"shape": [2, 3], "dtype": "float32", "contiguous": False, "strides": [1, 2]}}


@pytest.mark.parametrize("bad", [Opaque(), torch.device("cpu"), b"bytes", {1, 2}], ids=["object", "device", "bytes", "set"])
def test_key_to_json_rejects_unsupported_parts_clearly(bad):
    with pytest.raises(TypeError, match=rf"type {type(bad).__name__} .*cannot be stored"):
        key_to_json(("ok", bad))


def test_unstorable_user_key_is_a_tiletune_error_at_the_first_call():
    space = tt.Space(T=[1, 2])

    @tt.autotune(space, key=lambda x: (x.shape[0], Opaque()), db=False, backend=FakeBackend(lambda c: 1.0),
                 progress=False)
    def op(cfg, x):
        return tt.Launch(lambda x: None, (1,), (x,))

    with pytest.raises(tt.TiletuneError, match="cannot be stored"):
        op(torch.zeros(2))
    assert op.tuning_count == 0


def test_user_key_with_dtype_is_stored_by_name():
    space = tt.Space(T=[1, 2])

    @tt.autotune(space, key=lambda x: (x.shape[0], x.dtype), db=False, backend=FakeBackend(lambda c: float(c.T)),
                 progress=False)
    def op(cfg, x):
        return tt.Launch(lambda x: None, (1,), (x,))

    op(torch.zeros(5, dtype=torch.float16))
    (res,) = op.results.values()
    assert res.identity.key == '[5,"float16"]'


# ---------------------------------------------------------------------------------------------
# first sight of a type (the per-type caches must not hide the detection code; issue 21)


def _fresh_duck(*, drop: str | None = None):
    """A new class (so no cache has seen it) with the tensor attributes, less ``drop``."""
    attrs = {
        "shape": (2, 3),
        "dtype": "float16",
        "stride": lambda self: (3, 1),
        "get_device": lambda self: 5,
    }
    if drop is not None:
        del attrs[drop]
    return type(f"Duck{drop or ''}", (), attrs)()


def test_a_new_duck_typed_tensor_is_detected_and_keyed_on_first_sight():
    import tiletune.keys as keys

    d = _fresh_duck()
    assert default_key((d,)) == ((2, 3), (3, 1), "float16", 5)  # the first call detects it
    assert type(d) in keys._tensor_types  # remembered: later calls skip the attribute probe
    assert is_tensor(d) and is_tensor(type(d)())  # and the answer is cached per type
    d2 = _fresh_duck()
    assert is_tensor(d2)


@pytest.mark.parametrize("missing", ["shape", "dtype", "stride", "get_device"])
def test_an_object_missing_a_tensor_attribute_is_not_a_tensor(missing):
    d = _fresh_duck(drop=missing)
    assert not is_tensor(d)
    assert not is_tensor(d)  # the cached answer agrees
    assert default_key((d,)) == (type(d), None)
    assert args_key_json((d,)) == [{"type": type(d).__name__}]


def test_torch_dtypes_are_registered_by_value_on_first_sight(monkeypatch):
    import tiletune.keys as keys

    monkeypatch.setattr(keys, "_BY_VALUE", set(keys._SCALARS))
    assert torch.dtype not in keys._BY_VALUE
    keys.is_tensor(_fresh_duck(drop="shape"))  # any first sight of a type registers torch's dtype
    assert torch.dtype in keys._BY_VALUE and None not in keys._BY_VALUE


def test_by_value_numpy_ints_and_dtypes_in_the_stored_key():
    np = pytest.importorskip("numpy")
    assert args_key_json((np.int32(5), torch.float16, np.bool_(True))) == [
        {"value": 5, "type": "int32"},
        {"value": "float16", "type": "dtype"},
        {"value": True, "type": np.bool_.__name__},
    ]
    assert default_key((np.int64(3),)) != default_key((np.int64(4),))


def test_key_to_json_error_says_what_a_key_may_hold():
    with pytest.raises(TypeError) as info:
        key_to_json((Opaque(),))
    assert str(info.value).endswith(
        "a key function must return ints, floats, strings, bools, None, dtypes or tuples of them")
