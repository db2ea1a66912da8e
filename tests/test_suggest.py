"""``tiletune suggest``: classifying kernel sources and printing the template's Space as code."""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from tiletune.lab.catalogue import template
from tiletune.cli import app
from tiletune.lab.suggest import classify, kernel_source, load_kernel, parse_setting, suggest

#: cuTile-style kernels (only parsed, never compiled or run), one per template
KERNELS = '''
import cuda.tile as ct

ConstInt = ct.Constant[int]


@ct.kernel
def add_kernel(X, Y, Z, TILE: ConstInt):
    bid = ct.bid(0)
    x = ct.load(X, (bid,), shape=(TILE,))
    y = ct.load(Y, (bid,), shape=(TILE,))
    ct.store(Z, (bid,), x + y)


def _row_sum(x):
    return ct.sum(x * x, axis=1, keepdims=True)


@ct.kernel
def rms_kernel(X, W, Y, eps, TN: ConstInt):
    bid = ct.bid(0)
    x = ct.load(X, (bid, 0), shape=(1, TN)).astype(ct.float32)
    r = ct.rsqrt(_row_sum(x) / TN + eps)
    ct.store(Y, (bid, 0), (x * r).astype(Y.dtype))


@ct.kernel
def softmax_kernel(X, Y, TN: ConstInt):
    bid = ct.bid(0)
    x = ct.load(X, (bid, 0), shape=(1, TN)).astype(ct.float32)
    m = ct.max(x, 1, keepdims=True)
    e = ct.exp(x - m)
    ct.store(Y, (bid, 0), e / ct.sum(e, axis=1, keepdims=True))


@ct.kernel
def xent_kernel(logits, targets, loss, V: ConstInt, CHUNK: ConstInt):
    row = ct.bid(0)
    m = ct.full((1, 1), -1e30, dtype=ct.float32)
    s = ct.zeros((1, 1), dtype=ct.float32)
    for j in range(ct.cdiv(V, CHUNK)):
        x = ct.load(logits, (row, j), shape=(1, CHUNK)).astype(ct.float32)
        m_new = ct.maximum(m, ct.max(x, axis=1, keepdims=True))
        s = s * ct.exp(m - m_new) + ct.sum(ct.exp(x - m_new), axis=1, keepdims=True)
        m = m_new
    t = ct.load(targets, (row,), shape=(1,))
    ct.store(loss, (row,), ct.log(s) + m)


@ct.kernel
def rope_kernel(Q, cos, sin, TS: ConstInt):
    b = ct.bid(0)
    q1 = ct.load(Q, (b, 0), shape=(TS, 64))
    q2 = ct.load(Q, (b, 1), shape=(TS, 64))
    c = ct.load(cos, (b, 0), shape=(TS, 64))
    s = ct.load(sin, (b, 0), shape=(TS, 64))
    ct.store(Q, (b, 0), q1 * c - q2 * s)
    ct.store(Q, (b, 1), q2 * c + q1 * s)


@ct.kernel
def gemm_kernel(A, B, C, TM: ConstInt, TN: ConstInt, TK: ConstInt, GROUP_SIZE_M: ConstInt):
    bid = ct.bid(0)
    acc = ct.zeros((TM, TN), dtype=ct.float32)
    for k in range(ct.cdiv(A.shape[1], TK)):
        a = ct.load(A, (bid, k), shape=(TM, TK))
        b = ct.load(B, (k, bid), shape=(TK, TN))
        acc = ct.mma(a, b, acc)
    ct.store(C, (bid, bid), acc.astype(C.dtype))


@ct.kernel
def attn_kernel(Q, K, V, O, TM: ConstInt, TN: ConstInt, D: ConstInt):
    q = ct.load(Q, (ct.bid(0), 0), shape=(TM, D))
    m = ct.full((TM, 1), -1e30, dtype=ct.float32)
    l = ct.zeros((TM, 1), dtype=ct.float32)
    acc = ct.zeros((TM, D), dtype=ct.float32)
    for j in range(ct.cdiv(K.shape[0], TN)):
        k = ct.load(K, (0, j), shape=(D, TN), order=(1, 0))
        s = ct.mma(q, k, ct.zeros((TM, TN), dtype=ct.float32))
        m_new = ct.maximum(m, ct.max(s, axis=1, keepdims=True))
        p = ct.exp2(s - m_new)
        l = l * ct.exp2(m - m_new) + ct.sum(p, axis=1, keepdims=True)
        acc = ct.mma(p.astype(Q.dtype), ct.load(V, (j, 0), shape=(TN, D)), acc * ct.exp2(m - m_new))
        m = m_new
    ct.store(O, (ct.bid(0), 0), (acc / l).astype(O.dtype))


@ct.kernel
def swiglu_mlp_kernel(X, WG, WU, Y, TM: ConstInt, TN: ConstInt, TK: ConstInt):
    g = ct.zeros((TM, TN), dtype=ct.float32)
    u = ct.zeros((TM, TN), dtype=ct.float32)
    for k in range(ct.cdiv(X.shape[1], TK)):
        x = ct.load(X, (ct.bid(0), k), shape=(TM, TK))
        g = ct.mma(x, ct.load(WG, (k, ct.bid(1)), shape=(TK, TN)), g)
        u = ct.mma(x, ct.load(WU, (k, ct.bid(1)), shape=(TK, TN)), u)
    y = g / (1.0 + ct.exp(-g)) * u
    ct.store(Y, (ct.bid(0), ct.bid(1)), y.astype(Y.dtype))


@ct.kernel
def moe_kernel(A, B, C, expert_offsets, TM: ConstInt, TN: ConstInt, TK: ConstInt):
    for tile in range(ct.bid(0), 1024, ct.num_blocks(0)):
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        acc = ct.mma(ct.load(A, (tile, 0), shape=(TM, TK)), ct.load(B, (0, tile), shape=(TK, TN)), acc)
        ct.store(C, (tile, 0), acc.astype(C.dtype))


def numpy_style(a, b):
    return a @ b
'''

EXPECTED = {
    "add_kernel": ("memory-bound", "elementwise"),
    "rms_kernel": ("balanced", "rowwise"),
    "softmax_kernel": ("balanced", "rowwise"),
    "xent_kernel": ("balanced", "cross_entropy"),
    "rope_kernel": ("memory-bound", "rope"),
    "gemm_kernel": ("compute-bound", "matmul"),
    "attn_kernel": ("compute-bound", "fmha"),
    "swiglu_mlp_kernel": ("compute-bound", "dual_gemm"),
    "moe_kernel": ("compute-bound", "grouped_gemm"),
    "numpy_style": ("compute-bound", "matmul"),
}


@pytest.fixture()
def kernels_module(tmp_path, monkeypatch):
    pytest.importorskip("cuda.tile")
    (tmp_path / "userkernels.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "userkernels", raising=False)
    return "userkernels"


def _source_of(name: str) -> str:
    """A kernel's source out of KERNELS (with the helpers: the whole text minus other kernels is not
    needed, classification follows calls itself when given an object)."""
    tree = ast.parse(KERNELS)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(KERNELS, fn)


@pytest.mark.parametrize("name", [n for n in EXPECTED if n != "rms_kernel"])
def test_classify_source(name):
    s = classify(_source_of(name))
    assert (s.kind, s.template) == EXPECTED[name], s.reasons
    assert s.reasons


def test_helpers_are_followed(kernels_module):
    kernel = load_kernel(f"{kernels_module}:rms_kernel")
    src = kernel_source(kernel)
    assert "def _row_sum" in src and "def rms_kernel" in src  # the reduction lives in the helper
    assert (classify(src).kind, classify(src).template) == EXPECTED["rms_kernel"]
    only = kernel_source(kernel, follow=False)
    assert "_row_sum(x)" in only and "def _row_sum" not in only
    assert classify(only).template == "elementwise"  # without the helper no reduction is seen


def test_the_library_kernels_are_recognised():
    pytest.importorskip("cuda.tile")
    expected = {
        "tiletune.kernels.gemm_kernels:gemm_kernel": "matmul",
        "tiletune.lab.examples.matmul_kernels:matmul_kernel": "matmul",
        "tiletune.kernels.attention_kernels:attention_kernel": "fmha",
        "tiletune.kernels.norms:rms_norm_kernel": "rowwise",
        "tiletune.kernels.norms:layer_norm_kernel": "rowwise",
        "tiletune.kernels.softmax_op:softmax_kernel": "rowwise",
        "tiletune.kernels.cross_entropy_op:cross_entropy_kernel": "cross_entropy",
        "tiletune.kernels.rope:rope_kernel": "rope",
        "tiletune.kernels.glu:glu_kernel": "elementwise",
    }
    for spec, name in expected.items():
        assert classify(kernel_source(load_kernel(spec))).template == name, spec


def _space_from(code: str, tmp_path):
    path = tmp_path / "suggested.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("suggested", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.space


def test_suggest_prints_runnable_code_of_the_template(kernels_module, tmp_path):
    code = suggest(f"{kernels_module}:rms_kernel", {"n_cols": 8192})
    assert code.startswith(f"# tiletune suggest {kernels_module}:rms_kernel\n# kind: balanced (")
    assert "unmeasured starting points" in code
    tree = ast.parse(code)  # it is Python
    assert any(isinstance(n, ast.Assign) and n.targets[0].id == "space" for n in tree.body)
    space = _space_from(code, tmp_path)
    assert space.hash == template("rowwise").space(n_cols=8192).hash


def test_template_override(kernels_module):
    code = suggest(f"{kernels_module}:add_kernel", template="rope")
    assert "--template rope (the source suggests elementwise)" in code
    assert "TS=" in code


runner = CliRunner()


def test_cli_suggest(kernels_module, tmp_path):
    r = runner.invoke(app, ["suggest", f"{kernels_module}:attn_kernel", "--set", "head_dim=64"])
    assert r.exit_code == 0, r.output
    assert "# kind: compute-bound" in r.stdout and "BLOCK_M=" in r.stdout
    assert _space_from(r.stdout, tmp_path).hash == template("fmha").space(head_dim=64).hash


@pytest.mark.parametrize("args, message", [
    (["suggest", "no_such_module_x:k"], "error: cannot import module 'no_such_module_x'"),
    (["suggest", "tiletune.lab.catalogue"], "error: expected MODULE:KERNEL"),
    (["suggest", "tiletune.lab.catalogue:nothing_here"], "error: module 'tiletune.lab.catalogue' has no attribute"),
    (["suggest", "tiletune.lab.catalogue:ARCHS"], "is not a cuTile kernel or a Python function"),
    (["suggest", "tiletune.lab.catalogue:template", "--set", "x"], "error: --set 'x': expected NAME=VALUE"),
    (["suggest", "tiletune.lab.catalogue:template", "--template", "nope"], "error: unknown template 'nope'"),
    (["suggest", "tiletune.lab.catalogue:template", "--set", "bogus=1"], "has no argument(s) 'bogus'"),
])
def test_cli_suggest_errors(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output


def test_parse_setting():
    assert parse_setting("n_cols=8192") == ("n_cols", 8192)
    assert parse_setting("tma=false") == ("tma", False)
    assert parse_setting("x=1.5") == ("x", 1.5)
    assert parse_setting("pass_=grad") == ("pass_", "grad")


def test_unparsable_source():
    with pytest.raises(ValueError, match="does not parse"):
        classify(textwrap.dedent("def f(:\n  pass"))
