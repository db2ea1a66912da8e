"""The per-call hot path: recipes (a recorded plan output replayed with a tuple operation) and the
plan-calling fallback, unit-tested and through the decorator on the CPU fake backend.

"Kernels" are Python callables; ``FakeBackend.launches`` records ``(config, grid, args)`` of every
launch, so the tests compare exactly what the op launched with what the plan would have returned.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices.backends.base import LaunchParts
from tiletune.devices.backends import FakeBackend
from tiletune.op.hotpath import build_entry, plan_recipe
from tiletune.keys import default_key

SPACE = tt.Space(TM=[32, 64, 128], occupancy=[1, 2], baseline=dict(TM=64, occupancy=1))
BEST = dict(TM=128, occupancy=2)


def model(cfg) -> float:
    # fastest: TM=128, occupancy=2 (clearly separated from the others)
    return 100.0 - 0.3 * cfg.TM - 10.0 * (cfg.occupancy - 1)


def noop_kernel(*args):
    pass


class Recorder:
    """``parts_for`` for build_entry: every launch is appended as ``(kernel, grid, kargs)``."""

    def __init__(self):
        self.launches = []
        self.made = []

    def __call__(self, kernel):
        self.made.append(kernel)

        def launch(stream, grid, k, kargs):
            self.launches.append((k, grid, kargs))

        return LaunchParts(launch, lambda d: None, kernel, 0)


def same_objects(got, expected):
    """Element-wise identity for tensors and other objects, equality for plain scalars."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if isinstance(e, (bool, int, str)) or e is None:
            assert type(g) is type(e) and g == e
        else:
            assert g is e, f"{g!r} is not the expected object {e!r}"


# ---------------------------------------------------------------------------------------------
# plan_recipe


def test_passthrough_args_and_int_constants_give_a_recipe():
    x, y = torch.zeros(4), torch.zeros(4)
    assert plan_recipe((x, y, 1000, 8), (x, y)) == ((0, 1, 2, 3), (1000, 8))
    assert plan_recipe((x, y), (x, y)) == ((0, 1), ())


def test_reordered_and_dropped_args_give_an_index_recipe():
    x, y, z = torch.zeros(1), torch.zeros(2), torch.zeros(3)
    assert plan_recipe((z, 1000, x), (x, y, z)) == ((2, 3, 0), (1000,))
    assert plan_recipe((y,), (x, y, z)) == ((1,), ())


def test_view_or_new_tensor_in_kernel_args_gives_no_recipe():
    x = torch.zeros(2, 3)
    assert plan_recipe((x.view(-1),), (x,)) is None
    assert plan_recipe((x, torch.empty(4)), (x,)) is None
    assert plan_recipe((x, x.t()), (x,)) is None


def test_float_derived_from_a_float_arg_gives_no_recipe_but_passthrough_does():
    x, eps = torch.zeros(4), 1e-6
    assert plan_recipe((x, 1.0 / eps), (x, eps)) is None
    assert plan_recipe((x, eps), (x, eps)) == ((0, 1), ())
    assert plan_recipe((eps, x), (x, eps)) == ((1, 0), ())
    # a float literal of the plan is not part of the key either: refused
    assert plan_recipe((x, 2.0), (x,)) is None


def test_str_none_and_bool_constants_are_allowed():
    x = torch.zeros(4)
    assert plan_recipe((x, "rows", None, True, False), (x,)) == ((0, 1, 2, 3, 4), ("rows", None, True, False))


@pytest.mark.parametrize(
    "const",
    [object(), [1, 2], (1, 2), {"a": 1}, 2.5, torch.float32, torch.tensor(3)],
    ids=["object", "list", "tuple", "dict", "float", "dtype", "0d-tensor"],
)
def test_arbitrary_objects_give_no_recipe(const):
    x = torch.zeros(4)
    assert plan_recipe((x, const), (x,)) is None


def test_arbitrary_object_passed_straight_through_is_fine():
    x, obj = torch.zeros(4), object()
    assert plan_recipe((obj, x), (x, obj)) == ((1, 0), ())


# ---------------------------------------------------------------------------------------------
# build_entry


def test_build_entry_identity_layout_launches_the_new_args():
    rec = Recorder()
    x, y = torch.zeros(4), torch.zeros(4)
    spec = (noop_kernel, [7], (x, y))  # grid given as a list: the entry launches a tuple
    entry, replays = build_entry(lambda *a: pytest.fail("plan called"), None, spec, (x, y), rec, True)
    assert replays is True
    x2, y2 = torch.ones(4), torch.ones(4)
    entry((x2, y2))
    ((k, grid, kargs),) = rec.launches
    assert k is noop_kernel and grid == (7,)
    same_objects(kargs, (x2, y2))


def test_build_entry_identity_layout_with_constants():
    rec = Recorder()
    x, y = torch.zeros(4), torch.zeros(4)
    entry, replays = build_entry(None, None, (noop_kernel, (2, 3), (x, y, 1000, "m")), (x, y), rec, True)
    assert replays is True
    x2, y2 = torch.ones(4), torch.ones(4)
    entry((x2, y2))
    ((_, grid, kargs),) = rec.launches
    assert grid == (2, 3)
    same_objects(kargs, (x2, y2, 1000, "m"))


def test_build_entry_reordered_layout_uses_the_new_args():
    rec = Recorder()
    x, y, z = torch.zeros(1), torch.zeros(2), torch.zeros(3)
    entry, replays = build_entry(None, None, (noop_kernel, (1,), (z, 1000, x)), (x, y, z), rec, True)
    assert replays is True
    x2, y2, z2 = torch.ones(1), torch.ones(2), torch.ones(3)
    entry((x2, y2, z2))
    same_objects(rec.launches[0][2], (z2, 1000, x2))


def test_build_entry_single_kernel_arg():
    rec = Recorder()
    x, y = torch.zeros(1), torch.zeros(2)
    entry, replays = build_entry(None, None, (noop_kernel, (1,), (y,)), (x, y), rec, True)
    assert replays is True
    y2 = torch.ones(2)
    entry((torch.ones(1), y2))
    same_objects(rec.launches[0][2], (y2,))


def test_build_entry_kernel_without_arguments():
    rec = Recorder()
    x = torch.zeros(2)
    entry, replays = build_entry(None, None, (noop_kernel, (1,), ()), (x,), rec, True)
    entry((torch.ones(2),))
    assert rec.launches == [(noop_kernel, (1,), ())]


def test_build_entry_without_recipe_calls_the_plan_every_time():
    calls = []
    other_kernel = lambda *a: None  # noqa: E731

    def plan(cfg, x):
        calls.append(x)
        return tt.Launch(noop_kernel if x.shape[0] == 2 else other_kernel, (x.shape[0],), (x.view(-1),))

    rec = Recorder()
    x = torch.zeros(2, 1)
    entry, replays = build_entry(plan, "cfg", plan("cfg", x), (x,), rec, True)
    assert replays is False
    calls.clear()
    x2, x3 = torch.ones(2, 1), torch.ones(3, 1)
    entry((x2,))
    entry((x3,))
    assert [c is e for c, e in zip(calls, (x2, x3))] == [True, True]
    (k2, g2, a2), (k3, g3, a3) = rec.launches
    assert (k2, g2, k3, g3) == (noop_kernel, (2,), other_kernel, (3,))
    assert a2[0]._base is x2 and a3[0]._base is x3
    # a launcher per distinct kernel object, made once
    assert rec.made == [noop_kernel, other_kernel]
    entry((torch.ones(3, 1),))
    assert rec.made == [noop_kernel, other_kernel]


def test_build_entry_use_recipe_false_calls_the_plan():
    n = [0]

    def plan(cfg, x):
        n[0] += 1
        return (noop_kernel, (1,), (x,))

    x = torch.zeros(2)
    rec = Recorder()
    entry, replays = build_entry(plan, None, plan(None, x), (x,), rec, False)
    assert replays is False
    x2 = torch.ones(2)
    entry((x2,))
    assert n[0] == 2
    same_objects(rec.launches[0][2], (x2,))


# ---------------------------------------------------------------------------------------------
# through the decorator


def double_into(y, x, tm, mode, flag):
    assert mode == "rows" and flag is None
    y.copy_(x * 2)


def make_counted_op(backend, **kw):
    calls = [0]

    @tt.autotune(SPACE, db=False, backend=backend, progress=False, **kw)
    def op(cfg, x, y):
        calls[0] += 1
        grid = ((x.shape[0] + cfg.TM - 1) // cfg.TM,)
        return tt.Launch(double_into, grid, (y, x, cfg.TM, "rows", None))

    return op, calls


def test_pure_plan_gets_a_recipe_that_launches_what_the_plan_would():
    be = FakeBackend(model, noise=0.002)
    op, calls = make_counted_op(be)
    x, y = torch.randn(300), torch.empty(300)
    op(x, y)
    assert op.tuning_count == 1
    assert op.recipe_keys == {default_key((x, y))}
    cfg = op.config_for(x, y)
    assert cfg.as_dict() == BEST
    torch.testing.assert_close(y, x * 2)

    before = calls[0]
    n = len(be.launches)
    fresh = [(torch.randn(300), torch.empty(300)) for _ in range(3)]
    for x2, y2 in fresh:
        op(x2, y2)
    assert calls[0] == before  # the recipe replays: the plan is not called
    assert len(be.launches) == n + 3
    for (x2, y2), (lcfg, grid, kargs) in zip(fresh, be.launches[n:]):
        expected = op.plan(cfg, x2, y2)
        assert lcfg == cfg
        assert grid == tuple(expected.grid) == (3,)
        same_objects(kargs, expected.args)
        assert kargs[0] is y2 and kargs[1] is x2 and kargs[0] is not y
        torch.testing.assert_close(y2, x2 * 2)
    assert op.tuning_count == 1


def test_user_key_function_calls_the_plan_every_call():
    be = FakeBackend(model, noise=0.002)
    op, calls = make_counted_op(be, key=lambda x, y: ("n", x.shape[0]))
    assert op.cache_plan is False
    x, y = torch.randn(64), torch.empty(64)
    op(x, y)
    assert op.recipe_keys == set()
    before, n = calls[0], len(be.launches)
    x2, y2 = torch.randn(64), torch.empty(64)
    op(x2, y2)
    op(x2, y2)
    assert calls[0] == before + 2
    same_objects(be.launches[n][2], (y2, x2, 128, "rows", None))
    torch.testing.assert_close(y2, x2 * 2)


def test_cache_plan_false_disables_recipes():
    be = FakeBackend(model, noise=0.002)
    op, calls = make_counted_op(be, cache_plan=False)
    x, y = torch.randn(64), torch.empty(64)
    op(x, y)
    assert op.recipe_keys == set()
    before, n = calls[0], len(be.launches)
    x2, y2 = torch.randn(64), torch.empty(64)
    op(x2, y2)
    assert calls[0] == before + 1
    assert be.launches[n][1] == (1,)
    same_objects(be.launches[n][2], (y2, x2, 128, "rows", None))


def test_plan_making_a_view_is_called_every_call():
    be = FakeBackend(model, noise=0.002)
    calls = [0]

    def flat_double(y, x):
        y.copy_(x * 2)

    @tt.autotune(SPACE, db=False, backend=be, progress=False)
    def op(cfg, x, y):
        calls[0] += 1
        return tt.Launch(flat_double, (1,), (y.view(-1), x.view(-1)))

    x, y = torch.randn(4, 4), torch.empty(4, 4)
    op(x, y)
    assert op.recipe_keys == set()
    before, n = calls[0], len(be.launches)
    x2, y2 = torch.randn(4, 4), torch.empty(4, 4)
    op(x2, y2)
    assert calls[0] == before + 1
    _, _, kargs = be.launches[n]
    assert kargs[0]._base is y2 and kargs[1]._base is x2
    torch.testing.assert_close(y2, x2 * 2)


def test_eps_passed_through_gets_a_recipe_and_follows_the_call():
    be = FakeBackend(model, noise=0.002)

    def k(x, eps):
        pass

    @tt.autotune(SPACE, db=False, backend=be, progress=False)
    def op(cfg, x, eps):
        return tt.Launch(k, (1,), (x, eps))

    x = torch.randn(8)
    op(x, 1e-6)
    assert len(op.recipe_keys) == 1
    eps2 = 1e-5
    x2 = torch.randn(8)
    op(x2, eps2)  # floats are keyed by type: same key, no re-tune
    assert op.tuning_count == 1
    _, _, kargs = be.launches[-1]
    assert kargs[0] is x2 and kargs[1] is eps2


def test_float_derived_from_eps_calls_the_plan():
    be = FakeBackend(model, noise=0.002)

    def k(x, inv):
        pass

    @tt.autotune(SPACE, db=False, backend=be, progress=False)
    def op(cfg, x, eps):
        return tt.Launch(k, (1,), (x, 1.0 / eps))

    x = torch.randn(8)
    op(x, 1e-6)
    assert op.recipe_keys == set()
    op(x, 0.5)
    assert be.launches[-1][2][1] == 2.0  # 1 / the new eps, not 1 / the first one


def test_different_strides_are_a_different_key_and_a_separate_tuning():
    be = FakeBackend(model, noise=0.002)
    seen = []

    def k(x):
        seen.append(x.is_contiguous())

    @tt.autotune(SPACE, db=False, backend=be, progress=False)
    def op(cfg, x):
        return tt.Launch(k, (1,), (x,))

    a = torch.randn(4, 8)
    b = torch.randn(8, 4).t()  # same shape (4, 8), strides (1, 4)
    assert a.shape == b.shape and a.stride() != b.stride()
    op(a)
    op(b)
    assert op.tuning_count == 2
    assert op.recipe_keys == {default_key((a,)), default_key((b,))}
    keys = sorted(r.identity.key for r in op.results.values())
    assert keys == [
        '[{"contiguous":false,"dtype":"float32","shape":[4,8],"strides":[1,4]}]',
        '[{"contiguous":true,"dtype":"float32","shape":[4,8]}]',
    ]
    n = len(be.launches)
    op(torch.randn(8, 4).t())
    op(torch.randn(4, 8))
    assert op.tuning_count == 2
    assert seen[-2:] == [False, True] and len(be.launches) == n + 2


def test_recipe_from_aliased_first_call_is_not_reused_for_distinct_args():
    be = FakeBackend(model, noise=0.002)

    @tt.autotune(SPACE, db=False, backend=be, progress=False)
    def op(cfg, x, y):
        return tt.Launch(noop_kernel, (1,), (x, y))

    a = torch.zeros(4)
    op(a, a)  # in-place style first call
    b, c = torch.zeros(4), torch.zeros(4)
    op(b, c)
    _, _, kargs = be.launches[-1]
    assert kargs[0] is b and kargs[1] is c


def test_grid_from_an_argument_keyed_by_type_is_not_baked():
    np = pytest.importorskip("numpy")
    be = FakeBackend(model, noise=0.002)

    @tt.autotune(SPACE, db=False, backend=be, progress=False)
    def op(cfg, x, n):
        return tt.Launch(noop_kernel, (int(n),), (x,))

    x = torch.zeros(4)
    op(x, np.int64(3))
    op(x, np.int64(7))
    assert be.launches[-1][1] == (7,)
