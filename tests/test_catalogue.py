"""The template catalogue (tiletune.lab.catalogue): valid spaces, rules, per-arch picks, printed code, tuning."""

from __future__ import annotations

import ast
import importlib.util
import itertools

import pytest

import tiletune as tt
from tiletune.space import templates as lib
from tiletune.lab.catalogue import ARCHS, KINDS, MEASURED_ARCHS, TEMPLATES, template

#: per template: argument sets to check besides the example
ARGS = {
    "elementwise": [{}],
    "rowwise": [dict(n_cols=n, dtype_bytes=b, streams=s, tma=t)
                for n, b, s, t in itertools.product((7, 128, 1000, 4096, 8192, 20000, 128256), (2, 4), (1, 2),
                                                    (True, False))],
    "cross_entropy": [dict(pass_="loss"), dict(pass_="grad")],
    "rope": [dict(heads_elems=h) for h in (64, 256, 1024, 2048, 4096, 32768)],
    "matmul": [dict(elem_bytes=b) for b in (1, 2, 4)],
    "fmha": [dict(head_dim=d) for d in (64, 128, 256)],
    "dual_gemm": [dict(elem_bytes=b) for b in (1, 2, 4)],
    "grouped_gemm": [dict(elem_bytes=b) for b in (1, 2, 4)],
}

CASES = [(name, kw) for name in TEMPLATES for kw in [TEMPLATES[name].example, *ARGS[name]]]


def test_the_catalogue_covers_the_kernel_kinds():
    assert set(TEMPLATES) == set(ARGS)
    assert {t.kind for t in TEMPLATES.values()} == set(KINDS)
    assert ARCHS == ("sm_80", "sm_89", "sm_90", "sm_100", "sm_120") and MEASURED_ARCHS == ("sm_90",)
    for t in TEMPLATES.values():
        assert t.kernels and t.knobs and t.evidence


@pytest.mark.parametrize("name, kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_template_yields_a_valid_space_on_every_arch(name, kw):
    space = template(name).space(**kw)
    assert isinstance(space, tt.Space)
    for arch in (*ARCHS, "sm_86", None):  # unnamed architectures get the sm_90 values
        cfgs = space.candidates(arch)
        assert 1 <= len(cfgs) <= 80
        base = space.baseline(arch)
        assert base is not None and cfgs[0] == base
        for c in cfgs:  # every config is inside its arch's values and passes the constraints
            assert space.index(c, arch) >= 0
    assert [c.as_dict() for c in space.candidates("sm_86")] == [c.as_dict() for c in space.candidates("sm_90")]


def _rows(space, arch):
    return [c.as_dict() for c in space.candidates(arch)]


@pytest.mark.parametrize("kw", ARGS["rowwise"])
def test_rowwise_sm90_is_the_library_space(kw):
    cat = template("rowwise").space(**kw)
    ref = lib.rowwise_space(kw["n_cols"], kw["dtype_bytes"], streams=kw["streams"], tma=kw["tma"])
    assert _rows(cat, "sm_90") == _rows(ref, "sm_90")


def test_library_spaces_are_the_sm90_picks():
    assert _rows(template("elementwise").space(), "sm_90") == _rows(lib.elementwise_space(), "sm_90")
    for h in (256, 2048, 4096):
        assert _rows(template("rope").space(heads_elems=h), "sm_90") == _rows(lib.rope_space(h), "sm_90")
    for b in (1, 2, 4):
        cat = [{k: v for k, v in c.items() if k != "num_ctas"} for c in _rows(template("matmul").space(elem_bytes=b),
                                                                              "sm_90")]
        assert cat == _rows(lib.matmul_space(b), "sm_90")
    ce = pytest.importorskip("tiletune.kernels.cross_entropy_op")
    assert _rows(template("cross_entropy").space(pass_="loss"), "sm_90") == _rows(ce.loss_space(), "sm_90")
    assert _rows(template("cross_entropy").space(pass_="grad"), "sm_90") == _rows(ce.grad_space(), "sm_90")
    att = pytest.importorskip("tiletune.kernels.attention_op")
    assert _rows(template("fmha").space(head_dim=128), "sm_90") == _rows(att.ATTENTION_SPACE, "sm_90")


def test_per_arch_picks_follow_the_hardware():
    mm = template("matmul").space(elem_bytes=2)
    assert {c.num_ctas for c in mm.candidates("sm_100")} == {1, 2}  # CTA pairs on Blackwell datacenter
    assert {c.num_ctas for c in mm.candidates("sm_90")} == {1}
    for arch in ("sm_89", "sm_120"):  # ~100 KB of shared memory: tiles <= 128 x 128, stages <= 32 KiB
        for c in mm.candidates(arch):
            assert c.TM <= 128 and c.TN <= 128 and (c.TM + c.TN) * c.TK * 2 <= 32768
    rows = template("rowwise").space(n_cols=4096)
    for arch in ("sm_80", "sm_89"):  # no TMA: no latency hint, plain stores
        assert {(c.LAT, c.STORE_TMA) for c in rows.candidates(arch)} == {(0, True)}
    assert {c.LAT for c in rows.candidates("sm_90")} == {0, 10}
    assert max(c.occupancy for c in rows.candidates("sm_120")) <= 2
    ce = template("cross_entropy").space(pass_="loss")
    assert max(c.CHUNK for c in ce.candidates("sm_120")) <= 8192
    fm = template("fmha").space(head_dim=256)
    assert all(c.BLOCK_M <= 128 and c.BLOCK_N <= 128 for a in ARCHS for c in fm.candidates(a))


def test_constraints_hold():
    for b in (1, 2, 4):
        for a in ARCHS:
            for c in template("dual_gemm").space(elem_bytes=b).candidates(a):
                assert (c.TM + 2 * c.TN) * c.TK * b <= 49152 and 2 * c.TM * c.TN * c.occupancy <= 256 * 128
                assert 2 * c.TM * c.TN < 256 * 128 or c.num_worker_warps == 8
            for c in template("grouped_gemm").space(elem_bytes=b).candidates(a):
                assert c.TM <= 128 and (c.TM + c.TN) * c.TK * b <= 49152 and c.TM * c.TN * c.occupancy <= 32768
    for a in ARCHS:
        for c in template("elementwise").space().candidates(a):
            assert 8 <= c.TILE // (32 * c.num_worker_warps) <= 32 and 8192 <= c.TILE * c.occupancy <= 65536
        for c in template("cross_entropy").space(pass_="loss").candidates(a):
            assert c.CHUNK * c.occupancy <= 32768
        for c in template("fmha").space().candidates(a):
            assert c.BLOCK_M * c.BLOCK_N <= 128 * 256


def _load(code: str, tmp_path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.space


@pytest.mark.parametrize("name, kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_printed_code_builds_the_same_space(name, kw, tmp_path):
    t = template(name)
    code = t.code(**kw)
    tree = ast.parse(code)
    assigns = [n for n in tree.body if isinstance(n, ast.Assign)]
    assert [a.targets[0].id for a in assigns] == ["space"]
    call = assigns[0].value
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == "tt.Space"
    space = t.space(**kw)
    assert [k.arg for k in call.keywords] == [*space.names, *(["constraints"] if space.constraint_names else []),
                                               "baseline"]
    printed = _load(code, tmp_path, f"printed_{name}")
    assert printed.hash == space.hash  # same values per arch, same rules (same closures), same baselines
    for arch in ARCHS:
        assert _rows(printed, arch) == _rows(space, arch)


def test_bad_template_arguments():
    with pytest.raises(ValueError, match="unknown template 'gemm'; templates are: elementwise"):
        template("gemm")
    with pytest.raises(ValueError, match="has no argument\\(s\\) 'n_rows'; its arguments are: n_cols=4096"):
        template("rowwise").space(n_rows=3)
    with pytest.raises(ValueError, match="elem_bytes must be 1, 2 or 4"):
        template("matmul").space(elem_bytes=3)
    with pytest.raises(ValueError, match="head_dim must be 64, 128 or 256"):
        template("fmha").space(head_dim=96)
    with pytest.raises(ValueError, match="pass_ must be 'loss' or 'grad'"):
        template("cross_entropy").space(pass_="both")


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_example_tunes_on_the_fake_backend(name):
    """Each template's example space tunes end to end (compile, check, time, rank) on the CPU fake
    backend, whose timing model favours one known config; the tuner finds it."""
    torch = pytest.importorskip("torch")
    from tiletune.devices.backends import FakeBackend, SimulatedCandidate
    from tiletune.records import DeviceInfo, Status

    t = template(name)
    space = t.space(**t.example)
    arch = "sm_100"
    cfgs = space.candidates(arch)
    target = cfgs[len(cfgs) // 2]

    def model(cfg):
        return 10.0 if cfg == target else 12.0 + 0.01 * space.index(cfg, arch)

    def failures(cfg):  # one config fails to compile, as real ones sometimes do
        return SimulatedCandidate(Status.COMPILE_ERROR, "simulated") if cfg == cfgs[-1] and cfg != target else None

    be = FakeBackend(model, noise=0.005, failures=failures, device=DeviceInfo("Fake B200", arch, 148))

    def kernel(x, y):
        y.copy_(x + 1)

    @tt.autotune(space, reference=lambda x, y: x + 1, writes=["y"], db=False, backend=be, progress=False,
                 name=f"example.{name}")
    def op(cfg, x, y):
        return tt.Launch(kernel, (1,), (x, y))

    x, y = torch.randn(8), torch.empty(8)
    op(x, y)
    assert op.config_for(x, y) == target
    torch.testing.assert_close(y, x + 1)
    (result,) = op.results.values()
    assert len(result.measurements) == len(cfgs)
