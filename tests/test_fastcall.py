"""Recipes of library-style ops (tiletune.kernels.fastcall) on the fake backend with CPU tensors: when a call
is replayed without the op's Python, what it launches, and every reason a signature keeps the slow path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.kernels import fastcall
from tiletune.devices.backends import FakeBackend

SPACE = tt.Space(TM=[32, 64, 128], baseline=dict(TM=64))


def model(cfg) -> float:
    return 100.0 - 0.2 * cfg.TM


def scale_rows(x2, w, y2, eps):
    y2.copy_(x2 * w * eps)


def make_library(be):
    """A miniature library op: checks, a 2-D view, a new output, one tuned launch, an N-D result."""
    calls = {"slow": 0}

    @tt.autotune(SPACE, reference=lambda x, w, y, eps: x * w * eps, writes=["y"], db=False, backend=be,
                 progress=False, name="scale")
    def plan(cfg, x2, w, y, eps):
        return tt.Launch(scale_rows, (cfg.TM,), (x2, w, y, eps))

    @fastcall.fast_op()
    def scale(x, w, eps=1.0):
        calls["slow"] += 1
        if x.shape[-1] != w.shape[0]:
            raise ValueError("scale(): w does not match x")
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.empty(x2.shape, dtype=x.dtype)
        plan(x2, w, y, float(eps))
        return y.view(x.shape)

    return scale, plan, calls


def test_third_call_replays_the_recipe_with_new_data():
    be = FakeBackend(model, noise=0.0)
    scale, plan, calls = make_library(be)
    w = torch.randn(8)
    for i in range(5):
        x = torch.randn(2, 3, 8)
        y = scale(x, w, 0.5)
        torch.testing.assert_close(y, x * w * 0.5)
        assert y.shape == (2, 3, 8) and y.is_contiguous()
    # call 1 tunes, call 2 learns, calls 3-5 replay
    assert calls["slow"] == 2
    assert plan.tuning_count == 1
    assert len(scale.fastcall.recipes) == 1
    assert all(c == SPACE.config(TM=128) for c, _, _ in be.launches[-3:])
    # keyword arguments reach the same recipe
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(scale(x, w=w, eps=0.5), x * w * 0.5)
    assert calls["slow"] == 2


def test_another_signature_takes_the_slow_path_again():
    be = FakeBackend(model, noise=0.0)
    scale, plan, calls = make_library(be)
    w = torch.randn(8)
    for _ in range(3):
        scale(torch.randn(4, 8), w, 0.5)
    n = calls["slow"]
    scale(torch.randn(4, 8, dtype=torch.float64), w.double(), 0.5)  # dtype
    scale(torch.randn(8, 4).t(), w, 0.5)  # strides
    scale(torch.randn(4, 8), w, 0.25)  # a float by value
    assert calls["slow"] == n + 3
    with pytest.raises(ValueError, match="does not match"):
        scale(torch.randn(4, 7), w, 0.5)


def test_cache_clear_of_the_tuned_op_drops_recipes():
    be = FakeBackend(model, noise=0.0)
    scale, plan, calls = make_library(be)
    w = torch.randn(8)
    for _ in range(3):
        scale(torch.randn(4, 8), w)
    assert fastcall.recipe_count() >= 1 and scale.fastcall.recipes
    plan.cache_clear()
    assert not scale.fastcall.recipes
    n = calls["slow"]
    scale(torch.randn(4, 8), w)
    assert calls["slow"] == n + 1


def test_views_into_the_arguments_are_rebuilt_per_call():
    be = FakeBackend(model, noise=0.0)

    def gated(a, b, y):
        y.copy_(a * torch.sigmoid(b))

    @tt.autotune(SPACE, reference=lambda a, b, y: a * torch.sigmoid(b), writes=["y"], db=False, backend=be,
                 progress=False)
    def plan(cfg, a, b, y):
        return tt.Launch(gated, (cfg.TM,), (a, b, y))

    @fastcall.fast_op()
    def glu(x):
        h = x.shape[-1] // 2
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.empty((x2.shape[0], h))
        plan(x2[:, :h], x2[:, h:], y)
        return y.view(*x.shape[:-1], h)

    for _ in range(4):
        big = torch.randn(3, 20)
        x = big[:, 2:18]  # a strided view with a storage offset
        got = glu(x)
        torch.testing.assert_close(got, x[:, :8] * torch.sigmoid(x[:, 8:]))
    assert len(glu.fastcall.recipes) == 1
    recipe = next(iter(glu.fastcall.recipes.values()))
    assert "as_strided" in recipe.source  # the fake backend takes torch views (cuTile: array interface)


def test_in_place_op_returns_its_arguments():
    be = FakeBackend(model, noise=0.0)

    def bump(q):
        q.add_(1)

    @tt.autotune(SPACE, reference=lambda q: q + 1, inplace=["q"], db=False, backend=be, progress=False)
    def plan(cfg, q):
        return tt.Launch(bump, (cfg.TM,), (q,))

    @fastcall.fast_op()
    def bump_(q, k):
        plan(q)
        return q, k

    for _ in range(3):
        q, k = torch.zeros(4), torch.zeros(2)
        out = bump_(q, k)
        assert out[0] is q and out[1] is k
        torch.testing.assert_close(q, torch.ones(4))
    assert len(bump_.fastcall.recipes) == 1


def _refusal(fn, *make_args, calls=4):
    for _ in range(calls):
        fn(*[m() for m in make_args])
    assert not fn.fastcall.recipes
    return next(iter(fn.fastcall.refusals.values()))


def _split_combine(be):
    """A two-launch op in the decode-attention pattern: partial sums into a temporary, then a combine."""
    calls = {"slow": 0}

    def partial(x, parts):
        parts.copy_(x.reshape(2, -1).sum(dim=1))

    def combine(parts, out, scale):
        out.copy_(parts.sum() * scale)

    @tt.autotune(SPACE, reference=lambda x, parts: x.reshape(2, -1).sum(dim=1), writes=["parts"], db=False,
                 backend=be, progress=False, name="partial")
    def partial_plan(cfg, x, parts):
        return tt.Launch(partial, (cfg.TM,), (x, parts))

    @tt.autotune(SPACE, reference=lambda parts, out, scale: parts.sum() * scale, writes=["out"], db=False,
                 backend=be, progress=False, name="combine")
    def combine_plan(cfg, parts, out, scale):
        return tt.Launch(combine, (cfg.TM,), (parts, out, scale))

    @fastcall.fast_op()
    def total(x, scale=1.0):
        calls["slow"] += 1
        parts = torch.empty(2)
        out = torch.empty(())
        partial_plan(x.reshape(-1), parts)
        combine_plan(parts, out, float(scale))
        return out

    return total, calls


def test_two_launches_with_a_temporary_are_replayed_in_order_with_a_fresh_temporary():
    be = FakeBackend(model, noise=0.0)
    total, calls = _split_combine(be)
    temps = []
    for i in range(6):
        x = torch.randn(3, 4)
        n0 = len(be.launches)
        got = total(x, 0.5)
        torch.testing.assert_close(got, x.sum() * 0.5)
        if i >= 2:  # replayed: the two kernels, partial first, each with this call's tensors
            new = be.launches[n0:]
            assert [len(launch[2]) for launch in new] == [2, 3]  # partial (x, parts), then combine (parts, out, s)
            assert new[0][2][0].data_ptr() == x.data_ptr()  # x read in place (a view of the call's tensor)
            assert new[0][2][1] is new[1][2][0]  # the temporary the first kernel wrote, the second read
            temps.append(new[0][2][1])
    # call 1 tunes both ops, call 2 learns, calls 3-6 replay
    assert calls["slow"] == 2 and len(total.fastcall.recipes) == 1
    source = next(iter(total.fastcall.recipes.values())).source
    assert "t0 = _empty(" in source and "_launch1(" in source  # a temporary allocated per call, two launches
    # sizes passed as separate ints (cheaper to parse); the 0-d output keeps its (empty) size tuple
    assert "t0 = _empty(*_ts0, " in source and "o0 = _empty(_os0, " in source
    assert all(t.shape == (2,) and t.untyped_storage().data_ptr() != 0 for t in temps)


def test_refusals():
    be = FakeBackend(model, noise=0.0)

    def copy(x, y):
        y.copy_(x)

    @tt.autotune(SPACE, reference=lambda x, y: x.clone(), writes=["y"], db=False, backend=be, progress=False)
    def plan(cfg, x, y):
        return tt.Launch(copy, (cfg.TM,), (x, y))

    @fastcall.fast_op()
    def copies_input(x):
        y = torch.empty(x.shape)
        plan(x.contiguous().clone(), y)
        return y

    assert "copy or scratch" in _refusal(copies_input, lambda: torch.randn(4))

    @fastcall.fast_op()
    def post_processes(x):
        y = torch.empty(x.shape)
        plan(x, y)
        return y.sum()

    assert "written whole" in _refusal(post_processes, lambda: torch.randn(4))

    @fastcall.fast_op()
    def too_many_launches(x):
        y = torch.empty(x.shape)
        for _ in range(fastcall.MAX_LAUNCHES + 1):
            plan(x, y)
        return y

    assert f"{fastcall.MAX_LAUNCHES + 1} tuned-op launches" in _refusal(too_many_launches, lambda: torch.randn(4))

    @fastcall.fast_op()
    def reads_scratch_no_launch_wrote(x):
        y = torch.empty(x.shape)
        tmp = torch.zeros(x.shape)  # initialised by torch, not by a recorded launch
        plan(tmp, y)
        return y

    assert "copy or scratch" in _refusal(reads_scratch_no_launch_wrote, lambda: torch.randn(4))

    @fastcall.fast_op()
    def reads_before_the_write(x):
        y = torch.empty(x.shape)
        tmp = torch.zeros(x.shape)
        plan(tmp, y)  # reads tmp first ...
        plan(x, tmp)  # ... a later launch writes it
        return y

    assert "copy or scratch" in _refusal(reads_before_the_write, lambda: torch.randn(4))

    @fastcall.fast_op()
    def partial_result(x):
        y = torch.empty((2,) + tuple(x.shape))
        plan(x, y[0])
        return y[0]

    assert "whole new contiguous" in _refusal(partial_result, lambda: torch.randn(4))

    @fastcall.fast_op()
    def scratch(x):
        y = torch.empty(x.shape)
        tmp = torch.empty(x.shape)
        plan(x, tmp)
        return y

    assert "written whole" in _refusal(scratch, lambda: torch.randn(4))

    # after MAX_ATTEMPTS refusals the signature is no longer recorded
    assert max(scratch.fastcall.attempts.values()) == fastcall.MAX_ATTEMPTS


def test_constant_tensors_and_precheck():
    be = FakeBackend(model, noise=0.0)
    placeholder = fastcall.constant_tensor(torch.zeros(1))

    def add(x, p, y):
        y.copy_(x + p)

    @tt.autotune(SPACE, reference=lambda x, p, y: x + p, writes=["y"], db=False, backend=be, progress=False)
    def plan(cfg, x, p, y):
        return tt.Launch(add, (cfg.TM,), (x, p, y))

    seen = []

    @fastcall.fast_op(precheck=lambda x, z: z.data_ptr() != x.data_ptr())
    def op(x, z):
        seen.append(1)
        if z.data_ptr() == x.data_ptr():
            raise ValueError("x and z must not share memory")
        y = torch.empty(x.shape)
        plan(x, placeholder, y)
        return y

    for _ in range(4):
        op(torch.randn(4), torch.randn(4))
    assert len(op.fastcall.recipes) == 1 and len(seen) == 2
    x = torch.randn(4)
    with pytest.raises(ValueError, match="share memory"):
        op(x, x)


def test_aliased_arguments_refuse_and_unhashable_arguments_pass_through():
    be = FakeBackend(model, noise=0.0)

    def copy(x, y):
        y.copy_(x)

    @tt.autotune(SPACE, reference=lambda x, y: x.clone(), writes=["y"], db=False, backend=be, progress=False)
    def plan(cfg, x, y):
        return tt.Launch(copy, (cfg.TM,), (x, y))

    @fastcall.fast_op()
    def op(a, b, opts=None):
        y = torch.empty(a.shape)
        plan(a, y)
        return y

    buf = torch.randn(8)
    assert "several call tensors" in _refusal(op, lambda: buf, lambda: buf)
    x = torch.randn(3)
    torch.testing.assert_close(op(x, x, [1, 2]), x)  # a list argument: no signature, still works


def test_views_of_one_fused_buffer_are_told_apart():
    """q and k as views of one qkv tensor: their extents interleave, their elements do not."""
    be = FakeBackend(model, noise=0.0)

    def scale_pair(q1, k1):
        q1.mul_(2)
        k1.mul_(3)

    @tt.autotune(SPACE, reference=lambda q1, k1: (q1 * 2, k1 * 3), inplace=["q1", "k1"], db=False, backend=be,
                 progress=False)
    def plan(cfg, q1, k1):
        return tt.Launch(scale_pair, (cfg.TM,), (q1, k1))

    @fastcall.fast_op()
    def rotate_(q, k):
        plan(q[..., :2], k[..., :2])  # first half of each head
        return q, k

    for _ in range(4):
        qkv = torch.randn(5, 6 * 4)  # 5 positions, 4 q heads + 2 k heads of 4 (as 6 x 4 columns)
        q = qkv[:, :16].view(5, 4, 4)
        k = qkv[:, 16:].view(5, 2, 4)
        q0, k0 = q.clone(), k.clone()
        rotate_(q, k)
        torch.testing.assert_close(q[..., :2], q0[..., :2] * 2)
        torch.testing.assert_close(q[..., 2:], q0[..., 2:])
        torch.testing.assert_close(k[..., :2], k0[..., :2] * 3)
    assert len(rotate_.fastcall.recipes) == 1, rotate_.fastcall.refusals


def test_addressable_offsets():
    t = torch.zeros(4, 6)[:, 1:5]  # strides (6, 1), 4 x 4 elements of a 4 x 6 buffer
    es = t.element_size()
    assert fastcall._addressable(t, 0) is True
    assert fastcall._addressable(t, 3 * es) is True
    assert fastcall._addressable(t, 4 * es) is False  # the gap column
    assert fastcall._addressable(t, (3 * 6 + 3) * es) is True
    assert fastcall._addressable(t, (3 * 6 + 4) * es) is False
    assert fastcall._addressable(t, -es) is False
    overlapping = torch.zeros(10).as_strided((3, 4), (2, 1))
    assert fastcall._addressable(overlapping, es) is None


def test_opfamily_configure_drops_recipes():
    from tiletune.kernels.library_op import LibraryOp

    be = FakeBackend(model, noise=0.0)
    scale, _, calls = make_library(be)
    w = torch.randn(8)
    for _ in range(3):
        scale(torch.randn(4, 8), w)
    assert scale.fastcall.recipes
    try:
        LibraryOp.configure(progress=False)
    finally:
        LibraryOp.configure()
    assert not scale.fastcall.recipes


def test_unlearnable_signatures_do_not_grow_memory(monkeypatch):
    monkeypatch.setattr(fastcall, "MAX_RECIPES", 2)
    be = FakeBackend(model, noise=0.0)

    def copy(x, y):
        y.copy_(x)

    @tt.autotune(SPACE, reference=lambda x, y: x.clone(), writes=["y"], db=False, backend=be, progress=False)
    def plan(cfg, x, y):
        return tt.Launch(copy, (cfg.TM,), (x, y))

    @fastcall.fast_op()
    def copies(x):
        y = torch.empty(x.shape)
        plan(x.clone(), y)  # a copy: never learnable
        return y

    for n in range(1, 30):
        copies(torch.randn(n))
    assert len(copies.fastcall.attempts) <= 8 and not copies.fastcall.recipes


# ------------------------------------------------------------------------------------------------
# tiletune.kernels.matmul_swiglu: the library op itself on the fake backend (a CPU stand-in kernel)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def swiglu_gemm(monkeypatch):
    """``matmul_swiglu`` on CPU tensors: its device check and SM count stubbed, its kernel a torch stand-in
    (the op's own ``_plan`` and kernel arguments), every library op on a fake backend without a database.
    Yields ``(op, backend, slow)``: ``slow["n"]`` counts the calls that ran the op's Python."""
    pytest.importorskip("cuda.tile")
    import importlib

    from tiletune.kernels.library_op import LibraryOp

    gg = importlib.import_module("tiletune.kernels.gemm_glu")

    def kernel(a, bg, bu, c, *consts):
        trans_b = consts[-1]
        g = a.float() @ (bg.float().t() if trans_b else bg.float())
        u = a.float() @ (bu.float().t() if trans_b else bu.float())
        c.copy_(torch.nn.functional.silu(g) * u)

    slow = {"n": 0}
    prepare = gg.prepare_matmul_swiglu

    def counted(x, w):
        slow["n"] += 1
        return prepare(x, w)

    monkeypatch.setattr(gg, "gemm_swiglu_kernel", kernel)
    monkeypatch.setattr(gg, "check_device", lambda op, **t: 0)
    monkeypatch.setattr(gg, "sm_count", lambda device: 132)
    monkeypatch.setattr(gg, "prepare_matmul_swiglu", counted)
    be = FakeBackend(lambda cfg: 100.0 - 0.01 * cfg.TM - 0.01 * cfg.TN, noise=0.0)
    LibraryOp.configure(backend=be, db=False, progress=False,
                       options=tt.TunerOptions(stopping=tt.StoppingRule(min_samples=1, max_samples=1)))
    try:
        yield gg.matmul_swiglu, be, slow
    finally:
        LibraryOp.configure()


def _swiglu_ref(x, w):
    n = w.shape[1] // 2
    p = x.float() @ w.float()
    return (torch.nn.functional.silu(p[..., :n]) * p[..., n:]).to(x.dtype)


def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def test_matmul_swiglu_replays_aligned_calls_of_both_weight_layouts(swiglu_gemm):
    op, be, slow = swiglu_gemm
    for make_w in (lambda: _bf16(32, 48), lambda: _bf16(48, 32).t()):  # row-major [K, 2N]; W.t() of [2N, K]
        op.fastcall.clear()
        w, n0, l0 = make_w(), slow["n"], len(be.launches)
        for _ in range(5):
            x = _bf16(2, 3, 32)
            got = op(x, w)
            torch.testing.assert_close(got, _swiglu_ref(x, w), rtol=2e-2, atol=2e-2)
            assert got.shape == (2, 3, 24) and got.is_contiguous()
        assert len(op.fastcall.recipes) == 1
        assert slow["n"] - n0 == 2  # tune, learn; then three replays
        assert len(be.launches) - l0 >= 5
        # the replayed launches read x in place (a view of the call's tensor), not a copy
        assert be.launches[-1][2][0].data_ptr() == x.data_ptr()


def test_matmul_swiglu_calls_that_copy_a_weight_half_are_never_replayed(swiglu_gemm):
    """[K, 8] bfloat16: 16-byte rows, but the up half starts 8 bytes in (TMA cannot read it): copied on
    every call, so the signature keeps the slow path; [K, 6]: 12-byte rows, both halves copied."""
    op, be, slow = swiglu_gemm
    for cols in (8, 6):
        w = _bf16(32, cols)
        n0 = slow["n"]
        for _ in range(5):
            x = _bf16(4, 32)
            torch.testing.assert_close(op(x, w), _swiglu_ref(x, w), rtol=2e-2, atol=2e-2)
            assert be.launches[-1][2][2].data_ptr() != w.data_ptr() + (cols // 2) * 2  # a copy, not a view
        assert slow["n"] - n0 == 5
        assert not op.fastcall.recipes
        assert any("copy" in why for why in op.fastcall.refusals.values())


def test_matmul_swiglu_misaligned_start_with_a_learnt_signature_takes_the_slow_path(swiglu_gemm):
    """The signature (shapes, strides) does not see where ``x`` starts: a call whose ``x`` starts 2 bytes
    into its storage has the signature of a learnt aligned call, but must not replay it (the slow path
    copies ``x`` for the kernel)."""
    op, be, slow = swiglu_gemm
    w = _bf16(32, 48)
    for _ in range(3):
        op(_bf16(4, 32), w)
    assert len(op.fastcall.recipes) == 1
    n0 = slow["n"]
    buf = _bf16(4 * 32 + 1)
    x = buf[1:].view(4, 32)  # same shape and strides, storage offset 1 element
    assert (x.shape, x.stride()) == ((4, 32), (32, 1))
    got = op(x, w)
    torch.testing.assert_close(got, _swiglu_ref(x, w), rtol=2e-2, atol=2e-2)
    assert slow["n"] == n0 + 1
    a = be.launches[-1][2][0]
    assert a.data_ptr() != x.data_ptr() and a.storage_offset() == 0  # the copy the kernel can read
    # a misaligned weight start too
    wbuf = _bf16(32 * 48 + 1)
    w2 = wbuf[1:].view(32, 48)
    x = _bf16(4, 32)
    torch.testing.assert_close(op(x, w2), _swiglu_ref(x, w2), rtol=2e-2, atol=2e-2)
    assert slow["n"] == n0 + 2
    # an aligned call still replays
    x = _bf16(4, 32)
    torch.testing.assert_close(op(x, w), _swiglu_ref(x, w), rtol=2e-2, atol=2e-2)
    assert slow["n"] == n0 + 2


def test_matmul_swiglu_empty_calls_launch_nothing_and_learn_nothing(swiglu_gemm):
    op, be, slow = swiglu_gemm
    w = _bf16(32, 48)
    n0 = len(be.launches)
    for _ in range(4):
        got = op(_bf16(0, 32), w)
        assert got.shape == (0, 24)
    assert len(be.launches) == n0 and not op.fastcall.recipes


def test_library_ops_leave_the_worker_unstarted_until_a_call_tunes(monkeypatch):
    """A library op is made on its first call: a database or table hit must not start the isolated
    worker (a process and a CUDA context); a plain tuned op defined by a user still starts it ahead."""
    from tiletune.devices import workers
    from tiletune.kernels.library_op import LibraryOp

    started = []
    monkeypatch.setattr(workers, "prestart", lambda *a, **k: started.append(a))
    monkeypatch.setattr("tiletune.devices.backends.prewarm_default", lambda: None)
    fam = LibraryOp("tiletune.test_deferred", lambda regime: SPACE, lambda cfg, x, y: tt.Launch(lambda *a: None, (1,), (x, y)),
                    writes=["y"])
    try:
        op = fam.op("r")
        assert op.isolation == "process" and started == []
        tt.autotune(SPACE, writes=["y"], isolation="process")(lambda cfg, x, y: tt.Launch(lambda *a: None, (1,), (x, y)))
        assert len(started) == 1
    finally:
        LibraryOp._instances.remove(fam)


def test_direct_entry_replays_the_recipe_through_the_guard(monkeypatch):
    """``fastcall.direct`` (what a custom op's implementation calls) is the op's hot path on positional
    arguments: it learns and replays the same recipes as the op, and a warm call is answered by the call
    guard, without building the signature, also from inside a ``torch.library`` op (the guard's
    dispatch-key check holds there: no autograd layer changes the dispatch state)."""
    be = FakeBackend(model, noise=0.0)
    scale, plan, calls = make_library(be)
    direct = scale.fastcall.direct
    w = torch.randn(8)
    for _ in range(3):
        x = torch.randn(4, 8)
        torch.testing.assert_close(direct(x, w, 0.5), x * w * 0.5)
    assert calls["slow"] == 2 and len(scale.fastcall.recipes) == 1
    scale(torch.randn(4, 8), w, 0.5)  # the public call finds the recipe direct learnt
    assert calls["slow"] == 2

    lib = torch.library.Library("tt_fastcall_test", "FRAGMENT")
    lib.define("scale(Tensor x, Tensor w, float eps) -> Tensor")
    lib.impl("scale", direct, "CPU")
    op = torch.ops.tt_fastcall_test.scale.default
    op(torch.randn(4, 8), w, 0.5)  # the guard is remembered from here
    built = []
    real = fastcall._call_signature
    monkeypatch.setattr(fastcall, "_call_signature", lambda *a: built.append(1) or real(*a))
    for _ in range(5):
        x = torch.randn(4, 8)
        torch.testing.assert_close(op(x, w, 0.5), x * w * 0.5)
        torch.testing.assert_close(direct(x, w, 0.5), x * w * 0.5)
    assert built == [] and calls["slow"] == 2


def test_report_counts_slow_calls_guard_misses_and_refusals():
    be = FakeBackend(model, noise=0.0)
    lens = fastcall.constant_tensor(torch.zeros(1))

    def add(x, p, y):
        y.copy_(x + p)

    @tt.autotune(SPACE, reference=lambda x, p, y: x + p, writes=["y"], db=False, backend=be, progress=False,
                 name="report_add")
    def plan(cfg, x, p, y):
        return tt.Launch(add, (cfg.TM,), (x, p, y))

    @fastcall.fast_op()
    def with_constant(x):
        y = torch.empty(x.shape)
        plan(x, lens, y)
        return y

    for _ in range(4):
        with_constant(torch.randn(4))
    row = fastcall.report()["with_constant"]
    assert row["recipes"] == 1 and row["slow_calls"] == 2 and row["refused"] == {} and row["guard_misses"] == 1
    with_constant(torch.randn(4))
    assert fastcall.report()["with_constant"]["slow_calls"] == 2  # replayed

    @fastcall.fast_op()
    def with_scratch(x):
        y = torch.empty(x.shape)
        plan(x, torch.zeros(1), y)  # a tensor no launch writes and no constant: no recipe
        return y

    assert "copy or scratch" in _refusal(with_scratch, lambda: torch.randn(4))
    row = fastcall.report()["with_scratch"]
    assert row["recipes"] == 0 and row["slow_calls"] == 4
    assert list(row["refused"].values()) == [1] and "copy or scratch" in next(iter(row["refused"]))

    with_constant.fastcall.clear()
    assert "with_constant" not in fastcall.report()


def test_calls_before_the_keys_settle_use_up_no_attempt(monkeypatch):
    """Keys served for a while without a settled config (an op's torch fallback while its configs compile
    in the background) must not leave the signature on the slow path for good once they settle."""
    be = FakeBackend(model, noise=0.0)
    scale, plan, calls = make_library(be)
    real = plan.settled
    state = {"n": 0}

    def settled(key):
        state["n"] += 1
        return None if state["n"] <= fastcall.MAX_ATTEMPTS + 2 else real(key)

    monkeypatch.setattr(plan, "settled", settled)
    w = torch.randn(8)
    for _ in range(fastcall.MAX_ATTEMPTS + 5):
        x = torch.randn(4, 8)
        torch.testing.assert_close(scale(x, w, 0.5), x * w * 0.5)
    assert len(scale.fastcall.recipes) == 1, scale.fastcall.refusals
    n = calls["slow"]
    scale(torch.randn(4, 8), w, 0.5)
    assert calls["slow"] == n


def test_a_stream_of_new_signatures_keeps_learning_within_the_limit(monkeypatch):
    """Shapes that change on every few calls (a cache grown by one position per step, met by every layer):
    past MAX_RECIPES the oldest recipes are dropped, and the newest signatures still replay."""
    monkeypatch.setattr(fastcall, "MAX_RECIPES", 2)
    be = FakeBackend(model, noise=0.0)
    scale, plan, calls = make_library(be)
    w = torch.randn(8)
    for n in range(1, 6):  # 5 signatures, each called by "3 layers"
        before = calls["slow"]
        for _ in range(3):
            x = torch.randn(n, 8)
            torch.testing.assert_close(scale(x, w, 0.5), x * w * 0.5)
        assert calls["slow"] - before == 2, n  # tune, learn; then a replay
        assert len(scale.fastcall.recipes) <= 2
    assert len(scale.fastcall.recipes) == 2
