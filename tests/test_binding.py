"""Keyword binding of tuned ops and library ops (tiletune.op.binding)."""

from __future__ import annotations

import inspect

import pytest

from tiletune.op.binding import positional_binder


def f(a, b, c=3, d=4):
    pass


def g(a, *, flag=False):
    pass


@pytest.mark.parametrize("args,kwargs,expected", [
    ((1,), {"b": 2}, (1, 2)),
    ((), {"b": 2, "a": 1}, (1, 2)),
    ((1, 2), {"d": 9}, (1, 2, 3, 9)),  # the gap is filled with its default
    ((1,), {"b": 2, "c": 5}, (1, 2, 5)),
])
def test_binds_like_a_call(args, kwargs, expected):
    bind = positional_binder(inspect.signature(f))
    assert bind(args, kwargs) == (expected, {})


@pytest.mark.parametrize("args,kwargs,message", [
    ((1, 2), {"z": 2}, "unexpected keyword argument 'z'"),
    ((1, 2), {"a": 1}, "multiple values for argument 'a'"),
    ((), {"a": 1}, "missing a required argument: 'b'"),
    ((), {"c": 1}, "missing a required argument: 'a'"),
])
def test_errors_are_those_of_a_call(args, kwargs, message):
    bind = positional_binder(inspect.signature(f))
    with pytest.raises(TypeError, match=message):
        bind(args, kwargs)


def test_keyword_only_parameters_come_back_apart():
    bind = positional_binder(inspect.signature(g))
    assert bind((1,), {"flag": True}) == ((1,), {"flag": True})


def test_learnt_patterns_bind_every_later_call_like_the_first():
    """The binder learns each (positional count, keyword names) pattern once; every later call with the
    pattern, whatever its values, binds (or fails) exactly like ``inspect`` (up to the last given)."""
    import itertools

    sig = inspect.signature(f)
    bind = positional_binder(sig)
    names = ["a", "b", "c", "d", "z"]

    def expected(args, kwargs):
        try:
            ba = sig.bind(*args, **kwargs)
        except TypeError:
            return TypeError
        last = max([len(args) - 1] + [list(sig.parameters).index(k) for k in kwargs])
        ba.apply_defaults()
        return tuple(ba.arguments[p] for p in list(sig.parameters)[:last + 1]), {}

    for n in range(0, 4):
        for k in range(1, 3):
            for chosen in itertools.permutations(names, k):
                for round_ in range(3):  # learn, then replay twice with other values
                    args = tuple(100 * round_ + i for i in range(n))
                    kwargs = {name: f"{name}{round_}" for name in chosen}
                    want = expected(args, kwargs)
                    if want is TypeError:
                        with pytest.raises(TypeError):
                            bind(args, kwargs)
                    else:
                        assert bind(args, kwargs) == want, (args, kwargs)
