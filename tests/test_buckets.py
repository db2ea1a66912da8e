"""Shape buckets (tiletune.buckets): rules, keys and their stored form."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tiletune.buckets import Buckets, bucket_size


@pytest.mark.parametrize("n,rule,expected", [
    (1, "pow2", 1), (3, "pow2", 4), (4, "pow2", 4), (300, "pow2", 512), (0, "pow2", 0),
    (5, (16, 64, 256), 16), (16, (16, 64, 256), 16), (17, (16, 64, 256), 64), (300, (16, 64, 256), 300),
    (10, lambda n: -(-n // 8) * 8, 16),
])
def test_bucket_size(n, rule, expected):
    assert bucket_size(n, rule) == expected


def test_a_rule_below_the_size_is_refused():
    with pytest.raises(ValueError, match="below the size"):
        bucket_size(10, lambda n: n - 1)


@pytest.mark.parametrize("rules,error", [
    ({}, ValueError), ({"x": {0: "pow3"}}, ValueError), ({"x": {0: [64, 16]}}, ValueError),
    ({"x": {0: [0, 16]}}, ValueError), ({"x": {"0": "pow2"}}, TypeError), ({"x": {}}, ValueError),
    ({1.5: {0: "pow2"}}, TypeError), ({"x": {0: [True, 4]}}, ValueError),
])
def test_bad_rules_are_refused_when_declared(rules, error):
    with pytest.raises(error):
        Buckets(rules)


def test_unknown_argument_names_are_refused_at_resolve():
    with pytest.raises(ValueError, match="'z' is not an argument"):
        Buckets({"z": {0: "pow2"}}).resolve(["x", "y"])


def test_keys_group_sizes_of_one_bucket():
    b = Buckets({"x": {0: "pow2"}, 1: {-2: "pow2"}}).resolve(["x", "y", "eps"])
    k300 = b.key((torch.empty(300, 64), torch.empty(300, 64), 1e-6))
    k500 = b.key((torch.empty(500, 64), torch.empty(500, 64), 1e-5))
    k600 = b.key((torch.empty(600, 64), torch.empty(600, 64), 1e-6))
    assert k300 == k500 != k600
    # other dims, dtypes and layouts stay exact
    assert b.key((torch.empty(300, 32), torch.empty(300, 64), 1e-6)) != k300
    assert b.key((torch.empty(300, 64, dtype=torch.float64), torch.empty(300, 64), 1e-6)) != k300
    assert b.key((torch.empty(64, 300).t(), torch.empty(300, 64), 1e-6)) != k300
    # a non-bucketed argument keeps its exact shape
    assert Buckets({"x": {0: "pow2"}}).resolve(["x", "y"]).key((torch.empty(3, 2), torch.empty(3, 2))) != \
        Buckets({"x": {0: "pow2"}}).resolve(["x", "y"]).key((torch.empty(3, 2), torch.empty(4, 2)))


def test_stored_key_is_marked_and_bucketed():
    b = Buckets({"x": {0: "pow2"}}).resolve(["x", "n"])
    js = b.key_json((torch.empty(300, 64), 7))
    assert js == [{"bucketed": True}, {"shape": [512, 64], "dtype": "float32", "contiguous": True}, 7]
    strided = b.key_json((torch.empty(64, 300).t(), 7))[1]
    assert strided["contiguous"] is False and strided["shape"] == [512, 64]
    assert strided["dim_order"] == [1, 0] and strided["stride_ratios"] == [1, 1]


def test_views_whose_strides_grow_with_the_bucketed_size_share_the_bucket():
    # the half views RoPE takes of (B, S, H, D): the batch stride is S*H*D; transposed matrices: stride M
    b = Buckets({"x": {1: "pow2"}}).resolve(["x"])
    for batch in (1, 3):
        keys = {b.key((torch.empty(batch, s, 32, 128)[..., :64],)) for s in (100, 120, 128)}
        assert len(keys) == 1, batch
        assert b.key_json((torch.empty(batch, 100, 32, 128)[..., :64],)) == \
            b.key_json((torch.empty(batch, 128, 32, 128)[..., :64],))
    assert b.key((torch.empty(batch, 100, 32, 128)[..., :64],)) != b.key((torch.empty(batch, 100, 32, 128),))
    t = Buckets({"x": {0: "pow2"}}).resolve(["x"])
    assert t.key((torch.empty(64, 300).t(),)) == t.key((torch.empty(64, 400).t(),))
    assert t.key((torch.empty(64, 300).t(),)) != t.key((torch.empty(300, 64),))
    # a padded row stride still tells keys apart; so does a size inside the bucketed dimension
    assert t.key((torch.empty(100, 4100)[:, :4096],)) == t.key((torch.empty(120, 4100)[:, :4096],))
    assert t.key((torch.empty(100, 4100)[:, :4096],)) != t.key((torch.empty(100, 4104)[:, :4096],))
    assert t.key((torch.empty(100, 4100)[:, :4096],)) != t.key((torch.empty(100, 4100)[:, :4095],))


# ---------------------------------------------------------------------------------------------- on an op

import tiletune as tt  # noqa: E402
from tiletune.devices.backends import FakeBackend  # noqa: E402
from tiletune.store import TuningDB  # noqa: E402

SPACE = tt.Space(TM=[32, 64, 128], baseline=dict(TM=64))


def model(cfg) -> float:
    return 100.0 - 0.2 * cfg.TM


def double(x, y):
    y.copy_(x * 2)


def make_op(be, db=False, buckets=None):
    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=db, backend=be, progress=False,
                 buckets=buckets if buckets is not None else tt.Buckets({"x": {0: "pow2"}, "y": {0: "pow2"}}))
    def op(cfg, x, y):
        return tt.Launch(double, (cfg.TM,), (x, y))

    return op


def test_a_new_shape_in_a_tuned_bucket_reuses_its_winner():
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    for m, tunings in ((300, 1), (500, 1), (512, 1), (257, 1), (600, 2), (1024, 2), (2, 3)):
        x = torch.randn(m, 4)
        y = op(x, torch.empty(m, 4))
        torch.testing.assert_close(y, x * 2)
        assert op.tuning_count == tunings, m
    assert all(c == SPACE.config(TM=128) for c, _, _ in be.launches[-3:])


def test_keys_served_by_their_bucket_are_bounded(monkeypatch):
    """A shape that changes on every call (a cache grown by concatenation) inside one tuned bucket: the op
    keeps at most MAX_BUCKET_KEYS such keys, forgets the oldest, and a forgotten key answers again from its
    bucket without tuning; the tuned key itself is never forgotten."""
    from tiletune.op import tuned_op

    monkeypatch.setattr(tuned_op, "MAX_BUCKET_KEYS", 8)
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    op(torch.randn(1024, 4), torch.empty(1024, 4))  # tunes the bucket (513..1024)
    tuned_key = next(iter(op.results))
    for m in list(range(600, 640)) + [600, 601]:  # 40 new shapes, then two forgotten ones again
        x = torch.randn(m, 4)
        torch.testing.assert_close(op(x, torch.empty(m, 4)), x * 2)
        assert len(op._cache) <= 8 + 1 and len(op._configs) <= 8 + 1 and len(op._refine) <= 8
    assert op.tuning_count == 1
    assert tuned_key in op._cache and tuned_key in op.chosen()
    assert all(c == SPACE.config(TM=128) for c, _, _ in be.launches[-42:])


def test_buckets_are_shared_through_the_database(tmp_path):
    db = TuningDB(tmp_path / "t.db")
    make_op(FakeBackend(model, noise=0.0), db=db)(torch.randn(300, 4), torch.empty(300, 4))
    op2 = make_op(FakeBackend(model, noise=0.0), db=db)
    op2(torch.randn(400, 4), torch.empty(400, 4))
    assert op2.tuning_count == 0
    # an op without buckets does not take a bucket's record for its exact key
    plain_be = FakeBackend(model, noise=0.0)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=db, backend=plain_be, progress=False)
    def op(cfg, x, y):
        return tt.Launch(double, (cfg.TM,), (x, y))

    op(torch.randn(512, 4), torch.empty(512, 4))
    assert op.tuning_count == 1


def test_buckets_and_key_function_do_not_combine():
    with pytest.raises(ValueError, match="cannot be combined"):
        tt.autotune(SPACE, key=lambda x, y: 1, buckets=tt.Buckets({"x": {0: "pow2"}}),
                    backend=FakeBackend(model))(lambda cfg, x, y: None)
    with pytest.raises(TypeError, match="tiletune.Buckets"):
        tt.autotune(SPACE, buckets={"x": {0: "pow2"}}, backend=FakeBackend(model))(lambda cfg, x, y: None)


def test_library_families_bucket_their_row_dimensions():
    pytest.importorskip("cuda.tile")
    import inspect

    from tiletune.kernels import gemm
    from tiletune.kernels.cross_entropy_op import CE_GRAD, CE_LOSS
    from tiletune.kernels.glu import GEGLU, SWIGLU
    from tiletune.kernels.norms import LAYER_NORM, RMS_NORM, RMS_NORM_RESIDUAL
    from tiletune.kernels.rope import ROPE
    from tiletune.kernels.softmax_op import SOFTMAX

    for fam in (RMS_NORM, RMS_NORM_RESIDUAL, LAYER_NORM, SOFTMAX, SWIGLU, GEGLU, CE_LOSS, CE_GRAD):
        params = list(inspect.signature(fam.plan).parameters)[1:]
        fam.buckets.resolve(params)  # every named argument exists
        assert all(rule == "pow2" for dims in fam.buckets.rules.values() for rule in dims.values())
    # RoPE and the GEMMs key named problems: the tokens / M bucketed to powers of two
    assert ROPE.buckets.named_rules == {"tokens": "pow2"}
    assert gemm.GEMM_BUCKETS.named_rules == {"M": "pow2"}
    assert gemm.GEMM.op(None).buckets.kind == gemm.GEMM_TF32.op(None).buckets.kind == "gemm"


def test_a_tuned_bucket_answers_a_new_shape_during_graph_capture():
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    op(torch.randn(300, 4), torch.empty(300, 4))  # tunes the 512 bucket
    assert op.tuning_count == 1
    be.capturing = True
    x = torch.randn(400, 4)
    y = op(x, torch.empty(400, 4))  # same bucket: its winner, installed for good, nothing pending
    torch.testing.assert_close(y, x * 2)
    assert op.pending == [] and op.tuning_count == 1
    assert be.launches[-1][0] == SPACE.config(TM=128)
    op(torch.randn(2000, 4), torch.empty(2000, 4))  # a bucket nobody tuned: the baseline, kept pending
    assert len(op.pending) == 1 and be.launches[-1][0] == SPACE.baseline(be.device_info(0).arch)
    be.capturing = False
    assert len(op.tune_pending()) == 1 and op.tuning_count == 2


def test_known_config_answers_a_new_shape_of_a_tuned_bucket():
    """``known_config`` (what a capture-time caller may ask before choosing its scratch) gives the
    bucket's winner for a shape never called, without installing, tuning or launching anything."""
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    assert op.known_config(torch.randn(300, 4), torch.empty(300, 4)) is None
    op(torch.randn(300, 4), torch.empty(300, 4))  # tunes the 512 bucket
    n = len(be.launches)
    assert op.known_config(torch.randn(400, 4), torch.empty(400, 4)) == SPACE.config(TM=128)
    assert op.known_config(torch.randn(2000, 4), torch.empty(2000, 4)) is None  # an untuned bucket
    assert len(be.launches) == n and op.tuning_count == 1 and len(op._configs) == 1
    # with refinement on, an exact record could still win over the bucket: no answer from the bucket
    ref = make_refining_op(FakeBackend(model, noise=0.0))
    ref(torch.randn(300, 4), torch.empty(300, 4))
    assert ref.known_config(torch.randn(400, 4), torch.empty(400, 4)) is None


# ---------------------------------------------------------------------------------------------- refinement


def make_refining_op(be, db=False):
    return make_op(be, db=db, buckets=tt.Buckets({"x": {0: "pow2"}, "y": {0: "pow2"}}, refine=True))


def size_model(cfg) -> float:
    return 100.0 - 0.2 * cfg.TM


def test_refinement_is_off_by_default_and_checked():
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    op(torch.randn(300, 4), torch.empty(300, 4))
    op(torch.randn(400, 4), torch.empty(400, 4))
    assert op.refining == [] and op.refine() == {}
    with pytest.raises(TypeError, match="refine must be True or False"):
        tt.Buckets({"x": {0: "pow2"}}, refine="yes")


def test_a_bucket_answer_is_queued_and_refined_on_fresh_tensors_of_its_shape():
    be = FakeBackend(model, noise=0.0)
    op = make_refining_op(be)
    x1 = torch.randn(300, 4)
    op(x1, torch.empty(300, 4))  # tunes the 512 bucket on this shape: nothing to refine
    assert op.tuning_count == 1 and op.refining == []
    x2, y2 = torch.randn(400, 4), torch.empty(400, 4)
    torch.testing.assert_close(op(x2, y2), x2 * 2)  # answered at once by the bucket
    assert op.tuning_count == 1 and len(op.refining) == 1
    x_before = x2.clone()
    y2.fill_(7.0)  # the caller's buffers hold other data by the time refinement runs
    done = op.refine()
    assert op.tuning_count == 2 and op.refining == [] and len(done) == 1
    (key,) = done
    assert op._configs[key] == done[key] and key in op.results
    # the refined session ran on fresh tensors of the shape, never on the caller's
    shapes = {tuple(a.shape) for _, _, args in be.launches[-3:] for a in args if hasattr(a, "shape")}
    assert shapes == {(400, 4)}
    assert bool((y2 == 7.0).all()) and torch.equal(x2, x_before)
    torch.testing.assert_close(op(x2, y2), x2 * 2)  # the exact winner now launches


def test_an_exact_record_wins_over_the_bucket_in_other_processes(tmp_path):
    db = TuningDB(tmp_path / "t.db")
    be = FakeBackend(model, noise=0.0)
    op = make_refining_op(be, db=db)
    op(torch.randn(300, 4), torch.empty(300, 4))
    op(torch.randn(400, 4), torch.empty(400, 4))
    op.refine()
    assert op.tuning_count == 2
    # another process: the exact record answers 400 rows, the bucket record 500 rows (queued again)
    be2 = FakeBackend(model, noise=0.0)
    op2 = make_refining_op(be2, db=db)
    op2(torch.randn(400, 4), torch.empty(400, 4))
    assert op2.tuning_count == 0 and op2.refining == []
    op2(torch.randn(500, 4), torch.empty(500, 4))
    assert op2.tuning_count == 0 and len(op2.refining) == 1
    # an op that does not refine ignores exact records: one bucket, one record
    be3 = FakeBackend(model, noise=0.0)
    op3 = make_op(be3, db=db)
    op3(torch.randn(400, 4), torch.empty(400, 4))
    assert op3.tuning_count == 0 and op3.refining == []


def test_background_refinement_never_blocks_resolved_calls():
    be = FakeBackend(model, noise=0.0)
    op = make_refining_op(be)
    op(torch.randn(300, 4), torch.empty(300, 4))
    op(torch.randn(400, 4), torch.empty(400, 4))
    thread = op.refine(background=True)
    x = torch.randn(300, 4)
    torch.testing.assert_close(op(x, torch.empty(300, 4)), x * 2)
    thread.join(30)
    assert not thread.is_alive() and op.tuning_count == 2 and op.refining == []


def test_a_refining_miss_hashes_the_kernel_sources_and_runs_the_plans_once():
    # a miss looks up the exact key, then resolves the bucket's: two identities of one call's
    # arguments, which share the kernel id (the plans' kernels) and differ only in the key
    be = FakeBackend(model, noise=0.0)
    hashed = []
    real = be.kernel_sources
    be.kernel_sources = lambda kernel: hashed.append(kernel) or real(kernel)
    plan_calls = []
    op = make_refining_op(be)
    real_spec = op._launch_spec
    op._launch_spec = lambda cfg, args: plan_calls.append(cfg) or real_spec(cfg, args)
    op(torch.randn(300, 4), torch.empty(300, 4))  # exact lookup misses, the bucket is tuned
    assert op.tuning_count == 1
    assert len(hashed) == 1  # one kernel in the space, hashed once for both identities
    # the identities and the session plan each config once; installing the winner plans it again
    *planned, installed = plan_calls
    assert sorted(planned, key=lambda c: c.TM) == sorted(SPACE.candidates(), key=lambda c: c.TM)
    assert installed == SPACE.config(TM=128)
    hashed.clear()
    op(torch.randn(400, 4), torch.empty(400, 4))  # the bucket answers; one exact lookup
    assert len(hashed) == 1 and op.tuning_count == 1 and len(op.refining) == 1
