"""Problem keys: the in-memory default key, its stored JSON form, and the JSON form of user keys."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.backends import FakeBackend
from tiletune.demo import ShapeOnly
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
    row = torch.zeros(4, 8)[:1, :]  # shape (1, 8), strides (8, 1): contiguous
    assert tensor_json(row) == {"shape": [1, 8], "dtype": "float32", "contiguous": True}
    col = torch.zeros(4, 8)[:, :1]  # shape (4, 1), strides (8, 1): not contiguous
    assert tensor_json(col)["contiguous"] is False and tensor_json(col)["strides"] == [8, 1]


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
