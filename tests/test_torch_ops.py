"""CPU tests of ``tiletune.kernels.torch_ops``: the library ops as ``torch.library`` custom ops.

Nothing here launches a kernel. The fake (meta) implementations are checked two ways:

* against the eager public functions themselves, run under a ``FakeTensorMode`` on fake CUDA
  tensors with the kernel launches stubbed out (what the eager op allocates is what it returns), and
* against torch's own ops on meta tensors (``torch.matmul`` over 1-D, 2-D and broadcast batched
  shapes, ``F.rms_norm``, ``F.layer_norm``, softmax, SDPA, a scalar cross-entropy loss).

``torch.compile(fullgraph=True)`` then traces a small transformer block made of
:func:`compiled_call` calls on meta tensors into one graph whose tiletune nodes are counted, with
dynamo alone and through AOTAutograd (where the in-place RoPE must be functionalized).
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.util
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from tiletune.kernels import torch_ops  # noqa: E402
from tiletune.kernels.torch_ops import OP_NAMES, PUBLIC_OPS, compiled_call  # noqa: E402

F = torch.nn.functional
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
FP8 = getattr(torch, "float8_e4m3fn", None)
META = "meta"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def meta_of(t):
    """What a consumer of an output sees: shape, dtype, strides, device type."""
    return tuple(t.shape), t.dtype, tuple(t.stride()), t.device.type


def contiguous_strides(shape):
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(out))


def empty(shape, dtype=BF16, device=META):
    return torch.empty(shape, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------

#: op -> (argument names, names of mutated arguments, number of returned tensors)
EXPECTED_SCHEMAS = {
    "rms_norm": (["x", "weight", "eps"], [], 1),
    "rms_norm_residual": (["x", "residual", "weight", "eps"], [], 2),
    "layer_norm": (["x", "weight", "bias", "eps"], [], 1),
    "softmax": (["x", "dim"], [], 1),
    "swiglu": (["x"], [], 1),
    "geglu": (["x", "approximate"], [], 1),
    "apply_rope_": (["q", "k", "cos", "sin", "layout"], ["q", "k"], 0),
    "cross_entropy": (["logits", "target", "ignore_index"], [], 1),
    "cross_entropy_grad": (["logits", "target", "ignore_index"], [], 2),
    "matmul": (["a", "b"], [], 1),
    "matmul_scaled": (["a", "b", "scale_a", "scale_b", "out_dtype"], [], 1),
    "attention": (["q", "k", "v", "causal", "scale"], [], 1),
    "matmul_swiglu": (["x", "w_gate_up"], [], 1),
    "decode_attention": (["q", "cache_k", "cache_v", "lengths", "lengths_int", "causal", "scale"], [], 1),
    "kv_cache_append": (["cache_k", "cache_v", "k", "v", "start", "start_int"], ["cache_k", "cache_v"], 0),
}


def test_every_op_is_registered_under_the_tiletune_namespace():
    assert set(OP_NAMES) == set(EXPECTED_SCHEMAS)
    for name in OP_NAMES:
        assert hasattr(torch.ops.tiletune, name), name
        schema = getattr(torch.ops.tiletune, name).default._schema
        assert schema.name == f"tiletune::{name}"


@pytest.mark.parametrize("name", sorted(EXPECTED_SCHEMAS))
def test_schemas_name_arguments_mutations_and_returns(name):
    args, mutated, n_returns = EXPECTED_SCHEMAS[name]
    schema = getattr(torch.ops.tiletune, name).default._schema
    assert [a.name for a in schema.arguments] == args
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == mutated
    assert len(schema.returns) == n_returns
    assert all(r.alias_info is None for r in schema.returns)  # fresh outputs, never an input


EXPECTED_SCHEMA_TEXT = [
    'tiletune::rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor',
    'tiletune::rms_norm_residual(Tensor x, Tensor residual, Tensor? weight, float eps) -> (Tensor, Tensor)',
    'tiletune::layer_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor',
    'tiletune::softmax(Tensor x, SymInt dim) -> Tensor',
    'tiletune::swiglu(Tensor x) -> Tensor',
    'tiletune::geglu(Tensor x, str approximate) -> Tensor',
    'tiletune::apply_rope_(Tensor(a0!) q, Tensor(a1!) k, Tensor cos, Tensor sin, str layout) -> ()',
    'tiletune::cross_entropy(Tensor logits, Tensor target, SymInt ignore_index) -> Tensor',
    'tiletune::cross_entropy_grad(Tensor logits, Tensor target, SymInt ignore_index) -> (Tensor, Tensor)',
    'tiletune::matmul(Tensor a, Tensor b) -> Tensor',
    'tiletune::matmul_scaled(Tensor a, Tensor b, Tensor? scale_a, Tensor? scale_b, ScalarType? out_dtype) -> Tensor',
    'tiletune::attention(Tensor q, Tensor k, Tensor v, bool causal, float? scale) -> Tensor',
    'tiletune::matmul_swiglu(Tensor x, Tensor w_gate_up) -> Tensor',
    'tiletune::decode_attention(Tensor q, Tensor cache_k, Tensor cache_v, Tensor? lengths, SymInt? lengths_int, '
    'bool causal, float? scale) -> Tensor',
    'tiletune::kv_cache_append(Tensor(a0!) cache_k, Tensor(a1!) cache_v, Tensor k, Tensor v, Tensor? start, '
    'SymInt? start_int) -> ()',
]


def test_schema_text():
    """The exact schemas (the same text in torch 2.11 and 2.13): types, mutations, returns."""
    assert [str(getattr(torch.ops.tiletune, n).default._schema) for n in OP_NAMES] == EXPECTED_SCHEMA_TEXT


def test_register_is_idempotent_and_import_needs_no_cuda_tile():
    code = (
        "import importlib, sys, torch\n"
        "import tiletune.kernels.torch_ops as T\n"
        "assert 'cuda.tile' not in sys.modules, 'torch_ops imported cuda.tile'\n"
        "T.register(); T.register()\n"
        "T = importlib.reload(T)\n"  # a second copy of the module finds the ops defined
        "T.register()\n"
        "assert 'cuda.tile' not in sys.modules\n"
        "x = torch.empty(3, 8, device='meta')\n"
        "assert T.compiled_call('rms_norm', x).shape == (3, 8)\n"
        "print('OK', len([n for n in T.OP_NAMES if hasattr(torch.ops.tiletune, n)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"OK {len(OP_NAMES)}"


def test_compiled_call_refuses_unknown_names_and_bad_arguments():
    with pytest.raises(ValueError, match="unknown op 'gelu'"):
        compiled_call("gelu", empty((2, 4)))
    assert set(PUBLIC_OPS) == set(torch_ops._ROUTES)
    with pytest.raises(TypeError, match="ignore_index"):
        compiled_call("cross_entropy", empty((2, 4)), empty((2,), torch.long), False, 1.5)
    with pytest.raises(TypeError, match="scale_a must be a float or a one-element tensor"):
        compiled_call("matmul", empty((2, 4), FP8), empty((4, 3), FP8), scale_a="1", scale_b=1.0)
    with pytest.raises(ValueError, match="dim True"):
        compiled_call("softmax", empty((2, 4)), True)


# ---------------------------------------------------------------------------------------------
# fake implementations vs the eager public functions (fake CUDA tensors, launches stubbed out)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def eager_without_launch(monkeypatch):
    """The public functions run their checks and allocations but launch nothing."""
    pytest.importorskip("cuda.tile")
    from tiletune.kernels import _membound

    gemm = importlib.import_module("tiletune.kernels.gemm")
    attn = importlib.import_module("tiletune.kernels.attention_op")
    monkeypatch.setattr(_membound.Prepared, "run", lambda self: self.result)
    for name in ("GEMM", "GEMM_TF32", "GEMM_FP8"):
        monkeypatch.setattr(getattr(gemm, name), "op", lambda regime: lambda *args: None)
    monkeypatch.setattr(gemm, "_unit_scale", lambda device: None)  # lru_cache would keep a fake tensor
    monkeypatch.setattr(attn.ATTENTION, "op", lambda regime: lambda *args: None)
    # short queries take the decode kernels (issue 20): same output allocation, no launch, no device query
    dec = importlib.import_module("tiletune.kernels.decode_attention_op")
    monkeypatch.setattr(dec.DecodeCall, "run", lambda self: self.out)
    monkeypatch.setattr(dec, "sm_count", lambda device: 132)
    # operand copies for the kernel (``contiguous()`` of a fake CUDA tensor needs a CUDA build of
    # torch) do not change what is allocated for the output
    monkeypatch.setattr(gemm, "_as_kernel_operand", lambda x: (x, False))
    monkeypatch.setattr(attn, "aligned_operand", lambda t: t)
    # the memory-bound ops index their inputs (``x2[:, :h]``), which fake CUDA tensors refuse on a
    # torch without CUDA: they run on meta tensors with the device check stubbed out instead
    for mod in ("norms", "softmax_op", "glu", "cross_entropy_op", "gemm_glu"):
        monkeypatch.setattr(importlib.import_module(f"tiletune.kernels.{mod}"), "check_device", lambda op, **t: 0)

    return {
        "rms_norm": importlib.import_module("tiletune.kernels.norms").rms_norm,
        "rms_norm_residual": importlib.import_module("tiletune.kernels.norms").rms_norm_residual,
        "layer_norm": importlib.import_module("tiletune.kernels.norms").layer_norm,
        "softmax": importlib.import_module("tiletune.kernels.softmax_op").softmax,
        "swiglu": importlib.import_module("tiletune.kernels.glu").swiglu,
        "geglu": importlib.import_module("tiletune.kernels.glu").geglu,
        "cross_entropy": importlib.import_module("tiletune.kernels.cross_entropy_op").cross_entropy,
        "matmul": gemm.matmul,
        "attention": attn.attention,
        "matmul_swiglu": importlib.import_module("tiletune.kernels.gemm_glu").matmul_swiglu,
        "decode_attention": dec.decode_attention,
    }


def _leaves(out):
    return list(out) if isinstance(out, tuple) else [out]


def _strided(shape, dtype, device, last):
    """A tensor whose rows are a slice of wider rows (``big[..., :last]``)."""
    return torch.empty((*shape[:-1], last + 8), dtype=dtype, device=device).narrow(-1, 0, last)


#: (public op, make(device) -> (args, kwargs)); every call is valid for the eager op
EAGER_CASES = [
    ("rms_norm", lambda d: ((empty((4, 8), device=d), empty((8,), F32, d)), {})),
    ("rms_norm", lambda d: ((empty((2, 3, 5), F16, d),), {"eps": 1e-5})),
    ("rms_norm", lambda d: ((_strided((6, 8), BF16, d, 8),), {})),
    ("rms_norm", lambda d: ((empty((0, 8), device=d),), {})),
    ("rms_norm", lambda d: ((empty((7,), F32, d), empty((7,), BF16, d)), {})),
    ("rms_norm_residual", lambda d: ((empty((2, 3, 8), device=d), empty((2, 3, 8), device=d), empty((8,), device=d)),
                                     {})),
    ("rms_norm_residual", lambda d: ((_strided((5, 16), F32, d, 16), empty((5, 16), F32, d)), {})),
    ("layer_norm", lambda d: ((empty((4, 8), device=d), empty((8,), device=d), empty((8,), device=d)), {})),
    ("layer_norm", lambda d: ((empty((3, 2, 6), F32, d),), {"eps": 1e-3})),
    ("softmax", lambda d: ((empty((2, 3, 4), device=d),), {})),
    ("softmax", lambda d: ((empty((2, 3, 4), device=d), 1), {})),
    ("softmax", lambda d: ((empty((2, 3, 4), F32, d), 0), {})),
    ("softmax", lambda d: ((empty((2, 3, 4), F16, d),), {"dim": -3})),
    ("softmax", lambda d: ((empty((9,), device=d),), {})),
    ("swiglu", lambda d: ((empty((4, 16), device=d),), {})),
    ("swiglu", lambda d: ((empty((2, 3, 10), F32, d),), {})),
    ("swiglu", lambda d: ((_strided((3, 8), BF16, d, 8),), {})),
    ("geglu", lambda d: ((empty((4, 16), device=d),), {"approximate": "tanh"})),
    ("geglu", lambda d: ((empty((5, 6), F16, d),), {})),
    ("cross_entropy", lambda d: ((empty((4, 10), device=d), empty((4,), torch.long, d)), {})),
    ("cross_entropy", lambda d: ((empty((2, 3, 10), F32, d), empty((2, 3), torch.int32, d)), {"return_grad": True})),
    ("cross_entropy", lambda d: ((empty((5, 7), F16, d), empty((5,), torch.long, d), True, 0), {})),
    ("cross_entropy", lambda d: ((empty((0, 7), device=d), empty((0,), torch.long, d)), {"return_grad": True})),
    ("attention", lambda d: ((empty((2, 4, 16, 64), device=d), empty((2, 2, 16, 64), device=d),
                              empty((2, 2, 16, 64), device=d)), {"causal": True})),
    ("attention", lambda d: ((empty((2, 16, 4, 128), F16, d).transpose(1, 2), empty((2, 4, 24, 128), F16, d),
                              empty((2, 4, 24, 128), F16, d)), {"scale": 0.1})),
    ("matmul_swiglu", lambda d: ((empty((4, 64), device=d), empty((64, 96), device=d)), {})),
    ("matmul_swiglu", lambda d: ((empty((2, 3, 64), F16, d), empty((96, 64), F16, d).t()), {})),  # W.t()
    ("matmul_swiglu", lambda d: ((_strided((5, 32), BF16, d, 32), empty((32, 6), device=d)), {})),  # copies
    ("matmul_swiglu", lambda d: ((empty((32,), device=d), empty((32, 16), device=d)), {})),  # 1-D x
    ("matmul_swiglu", lambda d: ((empty((0, 3, 32), device=d), empty((32, 16), device=d)), {})),  # no rows
    ("matmul_swiglu", lambda d: ((empty((4, 0), device=d), empty((0, 16), device=d)), {})),  # K = 0
    # attention's short queries take the decode kernels: one query token over 40 keys
    ("attention", lambda d: ((empty((2, 4, 1, 64), device=d), empty((2, 2, 40, 64), device=d),
                              empty((2, 2, 40, 64), device=d)), {})),
    ("decode_attention", lambda d: ((empty((2, 4, 1, 64), device=d), empty((2, 2, 32, 64), device=d),
                                     empty((2, 2, 32, 64), device=d)), {})),  # lengths None: the capacity
    ("decode_attention", lambda d: ((empty((2, 4, 3, 128), F16, d), empty((2, 4, 32, 128), F16, d),
                                     empty((2, 4, 32, 128), F16, d), 17), {"scale": 0.1})),
    ("decode_attention", lambda d: ((empty((2, 1, 4, 64), device=d).transpose(1, 2), empty((2, 2, 32, 64), device=d),
                                     empty((2, 2, 32, 64), device=d)),
                                    {"lengths": empty((2,), torch.int64, d), "causal": False})),
]

#: torch.matmul's shape rules: 1-D operands, (..., M, K) @ (K, N), broadcast batch dims, empty dims
MATMUL_SHAPES = [
    ((8,), (8,)),
    ((8,), (8, 5)),
    ((6, 8), (8,)),
    ((6, 8), (8, 5)),
    ((3, 6, 8), (8, 5)),
    ((2, 3, 6, 8), (8, 5)),
    ((3, 6, 8), (8,)),
    ((8,), (3, 8, 5)),
    ((3, 6, 8), (3, 8, 5)),
    ((1, 6, 8), (4, 8, 5)),
    ((4, 6, 8), (1, 8, 5)),
    ((2, 1, 6, 8), (3, 8, 5)),
    ((6, 8), (2, 3, 8, 5)),
    ((0, 8), (8, 5)),
    ((6, 0), (0, 5)),
    ((1, 6, 8), (0, 8, 5)),
    ((1, 8), (8, 1)),
]


def _matmul_cases():
    cases = []
    for sa, sb in MATMUL_SHAPES:
        cases.append(("matmul", lambda d, sa=sa, sb=sb: ((empty(sa, device=d), empty(sb, device=d)), {})))
    cases.append(("matmul", lambda d: ((empty((6, 8), F32, d), empty((5, 8), F32, d).t()), {})))
    cases.append(("matmul", lambda d: ((empty((3, 6, 8), F16, d), empty((5, 8), F16, d).t()), {"out_dtype": F16})))
    if FP8 is not None:
        cases.append(("matmul", lambda d: ((empty((6, 8), FP8, d), empty((8, 5), FP8, d)),
                                           {"scale_a": 0.5, "scale_b": 2.0})))
        cases.append(("matmul", lambda d: ((empty((2, 6, 8), FP8, d), empty((8,), FP8, d)),
                                           {"scale_a": torch.ones((), device=d), "scale_b": torch.ones(1, device=d),
                                            "out_dtype": F32})))
    return cases


ALL_EAGER_CASES = EAGER_CASES + _matmul_cases()


@pytest.mark.parametrize("case", range(len(ALL_EAGER_CASES)),
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(ALL_EAGER_CASES)])
def test_fake_matches_what_the_eager_op_allocates(case, eager_without_launch):
    name, make = ALL_EAGER_CASES[case]
    # matmul and attention check ``is_cuda``: fake CUDA tensors (the registered fake runs for them)
    on_cuda = name in ("matmul", "attention", "decode_attention")
    with FakeTensorMode() if on_cuda else contextlib.nullcontext():
        args, kwargs = make("cuda" if on_cuda else META)
        want = eager_without_launch[name](*args, **kwargs)
        got = compiled_call(name, *args, **kwargs)
    want, got = _leaves(want), _leaves(got)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert meta_of(g) == meta_of(w), (name, meta_of(g), meta_of(w))


def test_rope_through_compiled_call_returns_its_inputs():
    q = empty((2, 16, 4, 64))
    k = empty((2, 16, 2, 64))
    q2, k2 = compiled_call("apply_rope_", q, k, empty((16, 64)), empty((16, 64)))
    assert q2 is q and k2 is k
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    q3, k3 = compiled_call("apply_rope_", qt, kt, empty((1, 16, 32)), empty((1, 16, 32)), layout="bhsd")
    assert q3 is qt and k3 is kt
    with pytest.raises(ValueError, match="layout must be"):
        compiled_call("apply_rope_", q, k, empty((16, 64)), empty((16, 64)), "sbhd")


# ---------------------------------------------------------------------------------------------
# fake implementations vs torch's own ops on meta tensors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("sa, sb", MATMUL_SHAPES)
def test_matmul_fake_follows_torch_matmul(sa, sb, dtype):
    a, b = empty(sa, dtype), empty(sb, dtype)
    want = torch.matmul(a, b)
    got = torch.ops.tiletune.matmul(a, b)
    assert got.shape == want.shape
    assert got.dtype == dtype and got.device.type == META
    assert tuple(got.stride()) == contiguous_strides(want.shape)


def test_matmul_fake_concrete_shapes_and_dtypes():
    mm = lambda a, b, **kw: compiled_call("matmul", a, b, **kw)  # noqa: E731
    assert mm(empty((8,)), empty((8,))).shape == ()
    assert mm(empty((3, 6, 8)), empty((8,))).shape == (3, 6)
    assert mm(empty((2, 1, 6, 8)), empty((3, 8, 5))).shape == (2, 3, 6, 5)
    assert mm(empty((2, 1, 6, 8)), empty((3, 8, 5))).stride() == (90, 30, 5, 1)
    if FP8 is not None:
        a8, b8 = empty((4, 16), FP8), empty((16, 32), FP8)
        assert mm(a8, b8, scale_a=1.0, scale_b=torch.ones(1, device=META)).dtype == BF16
        assert mm(a8, b8, scale_a=1.0, scale_b=2.0, out_dtype=F32).dtype == F32
        with pytest.raises(ValueError, match="need scale_a and scale_b"):
            mm(a8, b8)
        with pytest.raises(TypeError, match="out_dtype of an fp8 product"):
            mm(a8, b8, scale_a=1.0, scale_b=1.0, out_dtype=torch.float64)


@pytest.mark.parametrize(
    "sa, sb, error",
    [
        ((6, 8), (7, 5), RuntimeError),       # inner dimensions differ (torch._check)
        ((8,), (7,), RuntimeError),
        ((2, 6, 8), (3, 8, 5), RuntimeError),  # batch dims do not broadcast
    ],
)
def test_matmul_fake_refuses_what_torch_matmul_refuses(sa, sb, error):
    with pytest.raises(error):
        torch.matmul(empty(sa), empty(sb))
    with pytest.raises(error):
        torch.ops.tiletune.matmul(empty(sa), empty(sb))


def test_matmul_fake_refuses_mixed_dtypes_and_stray_scales():
    with pytest.raises(TypeError, match="one dtype"):
        compiled_call("matmul", empty((4, 8), BF16), empty((8, 4), F16))
    with pytest.raises(ValueError, match="for float8_e4m3fn inputs only"):
        compiled_call("matmul", empty((4, 8)), empty((8, 4)), scale_a=1.0, scale_b=1.0)
    with pytest.raises(TypeError, match="out_dtype must be the inputs' dtype"):
        compiled_call("matmul", empty((4, 8)), empty((8, 4)), out_dtype=F32)


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 64), (7,)])
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_norm_fakes_follow_torch(shape, dtype):
    x = empty(shape, dtype)
    n = shape[-1]
    w, b = empty((n,), dtype), empty((n,), dtype)
    for got, want in [
        (compiled_call("rms_norm", x, w), F.rms_norm(x, (n,), w, 1e-6)),
        (compiled_call("layer_norm", x, w, b), F.layer_norm(x, (n,), w, b, 1e-5)),
    ]:
        assert meta_of(got) == meta_of(want)
        assert tuple(got.stride()) == contiguous_strides(shape)
    y, h = compiled_call("rms_norm_residual", x, empty(shape, dtype), w)
    assert meta_of(y) == meta_of(h) == (shape, dtype, contiguous_strides(shape), META)


@pytest.mark.parametrize("dim", [-1, 0, 1, 2])
def test_softmax_fake_follows_torch(dim):
    x = empty((2, 3, 5))
    got, want = compiled_call("softmax", x, dim), torch.softmax(x, dim)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    # the eager op normalizes x.movedim(dim, -1) contiguously and moves the dim back
    expected = {-1: (15, 5, 1), 2: (15, 5, 1), 0: (1, 10, 2), 1: (15, 1, 3)}[dim]
    assert tuple(got.stride()) == expected
    with pytest.raises(ValueError, match="out of range"):
        compiled_call("softmax", x, 3)


def test_glu_fakes_follow_torch():
    x = empty((2, 3, 20))
    want = F.silu(x[..., :10]) * x[..., 10:]
    for got in (compiled_call("swiglu", x), compiled_call("geglu", x), compiled_call("geglu", x, "tanh")):
        assert meta_of(got) == meta_of(want) == ((2, 3, 10), BF16, (30, 10, 1), META)
    with pytest.raises(RuntimeError, match="must be even"):
        compiled_call("swiglu", empty((4, 7)))
    with pytest.raises(ValueError, match="approximate must be"):
        compiled_call("geglu", x, "erf")


@pytest.mark.parametrize("x_shape, w_shape", [((6, 64), (64, 96)), ((2, 3, 64), (64, 16)), ((64,), (64, 2)),
                                             ((0, 64), (64, 8)), ((5, 0), (0, 8))])
def test_matmul_swiglu_fake_follows_torch(x_shape, w_shape):
    """``[..., N]`` of ``x``'s dtype, contiguous: what ``swiglu(x @ w)`` gives with torch's ops."""
    for dtype in (BF16, F16):
        x, w = empty(x_shape, dtype), empty(w_shape, dtype)
        n = w_shape[1] // 2
        u = torch.matmul(x, w)
        want = F.silu(u[..., :n]) * u[..., n:]
        got = compiled_call("matmul_swiglu", x, w)
        assert meta_of(got) == meta_of(want) == ((*x_shape[:-1], n), dtype, contiguous_strides((*x_shape[:-1], n)),
                                                 META)
        # a transposed view of a [2N, K] weight gives the same result metadata
        assert meta_of(compiled_call("matmul_swiglu", x, empty(w_shape[::-1], dtype).t())) == meta_of(want)


#: (x, w_gate_up, error type, message): the eager op's one-line refusals
MATMUL_SWIGLU_BAD = [
    (empty((4, 64), F32), empty((64, 8), F32), TypeError, r"^matmul_swiglu\(\): 'x' must be bfloat16 or float16, got float32$"),
    (empty((4, 64)), empty((64, 8), F32), TypeError, r"^matmul_swiglu\(\): 'w_gate_up' must be bfloat16 or float16, got float32$"),
    (empty((4, 64)), empty((64, 8), F16), TypeError, r"^matmul_swiglu\(\): 'x' is bfloat16 but 'w_gate_up' is float16; they must match$"),
    (empty(()), empty((64, 8)), ValueError, r"^matmul_swiglu\(\): 'x' must have at least one dimension"),
    (empty((4, 64)), empty((64, 4, 2)), ValueError, r"^matmul_swiglu\(\): 'w_gate_up' must be 2-D \[K, 2N\], got shape \(64, 4, 2\)$"),
    (empty((4, 64)), empty((64, 7)), ValueError, r"^matmul_swiglu\(\): 'w_gate_up' must have an even number of columns >= 2"),
    (empty((4, 64)), empty((64, 0)), ValueError, r"even number of columns >= 2 .*got shape \(64, 0\)$"),
    (empty((4, 64)), empty((63, 8)), ValueError, r"^matmul_swiglu\(\): inner dimensions differ: x \(4, 64\) @ w_gate_up \(63, 8\)$"),
]


@pytest.mark.parametrize("case", range(len(MATMUL_SWIGLU_BAD)))
def test_matmul_swiglu_fake_refuses_what_the_op_refuses(case, monkeypatch):
    """The fake raises the eager op's error, type and one-line message, for each bad call; the eager op
    (its device check stubbed: meta tensors) raises the same."""
    x, w, error, message = MATMUL_SWIGLU_BAD[case]
    with pytest.raises(error, match=message) as got:
        compiled_call("matmul_swiglu", x, w)
    assert "\n" not in str(got.value)
    if importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.tile") is not None:
        gg = importlib.import_module("tiletune.kernels.gemm_glu")
        monkeypatch.setattr(gg, "check_device", lambda op, **t: 0)
        with pytest.raises(error) as eager:
            gg.matmul_swiglu(x, w)
        assert str(eager.value) == str(got.value)


def test_matmul_swiglu_fake_under_dynamic_compile_keeps_its_refusals():
    """With symbolic sizes the shape checks are ``torch._check``s: a good call compiles into one node,
    a bad one still fails with the op's message."""
    backend = CountingBackend()
    fn = torch.compile(lambda x, w: compiled_call("matmul_swiglu", x, w), fullgraph=True, dynamic=True,
                       backend=backend)
    assert meta_of(fn(empty((5, 64)), empty((64, 96)))) == ((5, 48), BF16, (48, 1), META)
    assert meta_of(fn(empty((2, 7, 32)), empty((32, 16)))) == ((2, 7, 8), BF16, (56, 8, 1), META)
    assert all(tiletune_ops_in(g) == collections.Counter({"matmul_swiglu": 1}) for g in backend.graphs)
    with pytest.raises(Exception, match="inner dimensions differ"):
        fn(empty((5, 64)), empty((32, 96)))


def test_cross_entropy_fake_is_a_float32_scalar_and_a_logits_shaped_grad():
    logits, target = empty((2, 3, 50)), empty((2, 3), torch.long)
    ref = F.cross_entropy(logits.reshape(-1, 50).float(), target.reshape(-1))
    loss = compiled_call("cross_entropy", logits, target)
    assert meta_of(loss) == ((), F32, (), META) == meta_of(ref)
    loss, grad = compiled_call("cross_entropy", logits, target, return_grad=True, ignore_index=0)
    assert meta_of(loss) == ((), F32, (), META)
    assert meta_of(grad) == ((2, 3, 50), BF16, (150, 50, 1), META)


def test_attention_fake_follows_sdpa():
    q, k, v = empty((2, 4, 16, 64)), empty((2, 2, 32, 64)), empty((2, 2, 32, 64))
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    got = compiled_call("attention", q, k, v, causal=False, scale=0.125)
    assert meta_of(got) == meta_of(want) == ((2, 4, 16, 64), BF16, (4096, 1024, 64, 1), META)
    qt = empty((2, 16, 4, 64)).transpose(1, 2)  # a transposed view in, a contiguous output out
    assert tuple(compiled_call("attention", qt, k, v).stride()) == (4096, 1024, 64, 1)


# ---------------------------------------------------------------------------------------------
# torch.library.opcheck (meta inputs: the utilities that need no real kernel)
# ---------------------------------------------------------------------------------------------

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _opcheck_args():
    x, w = empty((4, 64)), empty((64,))
    cases = {
        "rms_norm": (x, w, 1e-6),
        "rms_norm_residual": (x, empty((4, 64)), None, 1e-6),
        "layer_norm": (x, w, None, 1e-5),
        "softmax": (empty((2, 3, 8)), 1),
        "swiglu": (x,),
        "geglu": (x, "tanh"),
        "apply_rope_": (empty((2, 8, 4, 64)), empty((2, 8, 2, 64)), empty((8, 64)), empty((8, 64)), "bshd"),
        "cross_entropy": (x, empty((4,), torch.long), -100),
        "cross_entropy_grad": (x, empty((4,), torch.long), -100),
        "matmul": (empty((3, 4, 64)), empty((64, 32))),
        "matmul_scaled": (empty((3, 4, 64)), empty((64, 32)), None, None, None),
        "attention": (empty((1, 4, 8, 64)), empty((1, 2, 8, 64)), empty((1, 2, 8, 64)), True, None),
        "matmul_swiglu": (empty((3, 4, 64)), empty((64, 96))),
        "decode_attention": (empty((2, 4, 1, 64)), empty((2, 2, 32, 64)), empty((2, 2, 32, 64)),
                             empty((2,), torch.int32), None, True, None),
        "kv_cache_append": (empty((2, 2, 32, 64)), empty((2, 2, 32, 64)), empty((2, 2, 1, 64)),
                            empty((2, 2, 1, 64)), None, 5),
    }
    assert set(cases) == set(OP_NAMES)
    return cases


@pytest.mark.parametrize("name", OP_NAMES)
def test_opcheck_on_meta_inputs(name):
    args = _opcheck_args()[name]
    result = torch.library.opcheck(getattr(torch.ops.tiletune, name).default, args, test_utils=OPCHECK_UTILS)
    assert result == {u: "SUCCESS" for u in OPCHECK_UTILS}


# ---------------------------------------------------------------------------------------------
# torch.compile over a small transformer block on meta tensors
# ---------------------------------------------------------------------------------------------

B, S, H, HKV, D, FF = 2, 16, 4, 2, 64, 384
HID = H * D


def decoder_block(x, w_norm1, w_qkv, cos, sin, w_o, w_norm2, w_up, w_down):
    """rms_norm -> qkv matmul -> in-place RoPE on views -> causal GQA attention -> out proj ->
    rms_norm_residual -> gate/up matmul -> swiglu -> down matmul (+ residual)."""
    h = compiled_call("rms_norm", x, w_norm1)
    qkv = compiled_call("matmul", h, w_qkv)
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    q, k, v = q.view(B, S, H, D), k.view(B, S, HKV, D), v.view(B, S, HKV, D)
    q, k = compiled_call("apply_rope_", q, k, cos, sin)
    o = compiled_call("attention", q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    o = o.transpose(1, 2).reshape(B, S, HID)
    a = compiled_call("matmul", o, w_o)
    y, res = compiled_call("rms_norm_residual", a, x, w_norm2)
    u = compiled_call("matmul", y, w_up)
    g = compiled_call("swiglu", u)
    out = compiled_call("matmul", g, w_down)
    return out + res, o, u


def block_inputs(device=META, dtype=BF16):
    e = lambda *s: torch.empty(s, device=device, dtype=dtype)  # noqa: E731
    return (e(B, S, HID), e(HID), e(HID, (H + 2 * HKV) * D), e(S, D), e(S, D), e(HID, HID), e(HID),
            e(HID, 2 * FF), e(FF, HID))


EXPECTED_BLOCK_OPS = collections.Counter(
    {"matmul": 4, "rms_norm": 1, "apply_rope_": 1, "attention": 1, "rms_norm_residual": 1, "swiglu": 1})


def tiletune_ops_in(gm):
    """Counter of the tiletune custom ops called by an FX graph (packets or overloads)."""
    found = collections.Counter()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
            qual = target._qualified_op_name if isinstance(target, torch._ops.OpOverloadPacket) else target.name()
            qual = qual.split(".")[0]
            if qual.startswith("tiletune::"):
                found[qual[len("tiletune::"):]] += 1
    return found


class CountingBackend:
    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def test_decoder_block_compiles_to_one_graph_of_tiletune_ops():
    backend = CountingBackend()
    fn = torch.compile(decoder_block, fullgraph=True, backend=backend)
    out, o, u = fn(*block_inputs())
    assert len(backend.graphs) == 1
    assert tiletune_ops_in(backend.graphs[0]) == EXPECTED_BLOCK_OPS
    assert meta_of(out) == ((B, S, HID), BF16, (S * HID, HID, 1), META)
    assert meta_of(o) == ((B, S, HID), BF16, (S * HID, HID, 1), META)
    assert meta_of(u) == ((B, S, 2 * FF), BF16, (S * 2 * FF, 2 * FF, 1), META)


def test_decoder_block_explain_has_no_graph_break():
    explanation = torch._dynamo.explain(decoder_block)(*block_inputs())
    assert explanation.graph_count == 1
    assert explanation.graph_break_count == 0
    assert tiletune_ops_in(explanation.graphs[0]) == EXPECTED_BLOCK_OPS


@pytest.mark.parametrize("dynamic", [False, True])
def test_decoder_block_through_aot_autograd_functionalizes_the_rope(dynamic):
    from torch._dynamo.backends.common import aot_autograd

    forward_graphs = []

    def fw_compiler(gm, example_inputs):
        forward_graphs.append(gm)
        return gm.forward

    fn = torch.compile(decoder_block, fullgraph=True, dynamic=dynamic, backend=aot_autograd(fw_compiler=fw_compiler))
    out, _, _ = fn(*block_inputs())
    assert tuple(out.shape) == (B, S, HID) and out.dtype == BF16
    assert len(forward_graphs) == 1
    ops = tiletune_ops_in(forward_graphs[0])
    # the mutating op is wrapped by auto_functionalized (its mutation of q and k is declared)
    assert ops == EXPECTED_BLOCK_OPS - collections.Counter({"apply_rope_": 1})
    wrapped = [n for n in forward_graphs[0].graph.nodes
               if n.op == "call_function" and "auto_functionalized" in str(n.target)]
    assert len(wrapped) == 1 and "tiletune.apply_rope_" in str(wrapped[0].args[0])


def _single_op_calls():
    x = empty((4, 64))
    return {
        "rms_norm": ((x, empty((64,))), {"eps": 1e-5}),
        "rms_norm_residual": ((x, empty((4, 64))), {}),
        "layer_norm": ((x,), {}),
        "softmax": ((empty((2, 3, 8)),), {"dim": 0}),
        "swiglu": ((x,), {}),
        "geglu": ((x,), {"approximate": "tanh"}),
        "apply_rope_": ((empty((2, 8, 4, 64)), empty((2, 8, 2, 64)), empty((8, 64)), empty((8, 64))), {}),
        "cross_entropy": ((x, empty((4,), torch.long)), {"return_grad": True}),
        "matmul": ((empty((3, 4, 64)), empty((64,))), {}),
        "attention": ((empty((1, 4, 8, 64)), empty((1, 2, 8, 64)), empty((1, 2, 8, 64))), {"causal": True}),
        "matmul_swiglu": ((empty((3, 4, 64)), empty((96, 64)).t()), {}),
        "decode_attention": ((empty((2, 4, 2, 64)), empty((2, 2, 32, 64)), empty((2, 2, 32, 64)), 9), {}),
        "kv_cache_append": ((empty((2, 2, 32, 64)), empty((2, 2, 32, 64)), empty((2, 2, 2, 64)), empty((2, 2, 2, 64)),
                             empty((2,), torch.int32)), {}),
    }


@pytest.mark.parametrize("name", PUBLIC_OPS)
def test_each_op_compiles_fullgraph_to_its_custom_op(name):
    args, kwargs = _single_op_calls()[name]
    backend = CountingBackend()
    fn = torch.compile(lambda *a: compiled_call(name, *a, **kwargs), fullgraph=True, backend=backend)
    got = _leaves(fn(*args))
    want = _leaves(compiled_call(name, *args, **kwargs))
    assert len(backend.graphs) == 1
    op = "cross_entropy_grad" if name == "cross_entropy" else name
    assert tiletune_ops_in(backend.graphs[0]) == collections.Counter({op: 1})
    assert [meta_of(t) for t in got] == [meta_of(t) for t in want]


def test_fp8_matmul_with_float_scales_compiles():
    if FP8 is None:
        pytest.skip("no float8_e4m3fn in this torch")
    backend = CountingBackend()

    def fn(a, b):
        return compiled_call("matmul", a, b, scale_a=0.5, scale_b=4.0, out_dtype=F16)

    out = torch.compile(fn, fullgraph=True, backend=backend)(empty((2, 8, 32), FP8), empty((32, 16), FP8))
    assert meta_of(out) == ((2, 8, 16), F16, (128, 16, 1), META)
    assert tiletune_ops_in(backend.graphs[0]) == collections.Counter({"matmul_scaled": 1})


def test_plain_matmul_node_carries_only_its_two_tensors():
    """A product without scales or out_dtype is ``tiletune::matmul(a, b)``: no ``None`` arguments boxed
    through the dispatcher on every compiled call (the scaled one is its own op)."""
    backend = CountingBackend()
    out = torch.compile(lambda a, b: compiled_call("matmul", a, b), fullgraph=True, backend=backend)(
        empty((2, 8, 32)), empty((32, 16)))
    assert meta_of(out) == ((2, 8, 16), BF16, (128, 16, 1), META)
    nodes = [n for n in backend.graphs[0].graph.nodes if n.op == "call_function" and "tiletune" in str(n.target)]
    assert len(nodes) == 1 and "matmul_scaled" not in str(nodes[0].target) and len(nodes[0].args) == 2


# ---------------------------------------------------------------------------------------------
# the public functions route to the custom ops while compiling
# ---------------------------------------------------------------------------------------------


def public_block(K, x, w_norm1, w_qkv, cos, sin, w_o, w_norm2, w_up, w_down):
    """:func:`decoder_block` written with the public functions, plus the ops it does not use."""
    h = K.rms_norm(x, w_norm1)
    qkv = K.matmul(h, w_qkv)
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    q, k, v = q.view(B, S, H, D), k.view(B, S, HKV, D), v.view(B, S, HKV, D)
    K.apply_rope_(q, k, cos, sin)
    o = K.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    a = K.matmul(o.transpose(1, 2).reshape(B, S, HID), w_o)
    y, res = K.rms_norm_residual(a, x, w_norm2)
    out = K.matmul(K.swiglu(K.matmul(y, w_up)), w_down) + res
    target = torch.zeros((B * S,), dtype=torch.long, device=x.device)
    loss, grad = K.cross_entropy(out.reshape(B * S, HID), target, return_grad=True)
    return (out, loss, grad, K.softmax(out, dim=1), K.layer_norm(out), K.geglu(out, approximate="tanh"),
            K.matmul_swiglu(y, w_up))


def public_functions():
    """The public functions, taken from their defining modules."""
    import types

    from tiletune.kernels import _DECODE_OPS, _FUSED_OPS, _MEMORY_OPS

    where = {**_MEMORY_OPS, **_FUSED_OPS, **_DECODE_OPS, "matmul": "gemm", "attention": "attention_op"}
    return types.SimpleNamespace(**{name: getattr(importlib.import_module(f"tiletune.kernels.{mod}"), name)
                                    for name, mod in where.items()})


@pytest.mark.parametrize("fuse", [False, True])
def test_public_functions_route_to_the_custom_ops_under_compile(fuse, monkeypatch):
    """Every public op is its custom op under compile with ``TILETUNE_COMPILE_FUSE=0``; by default the
    memory-bound ones (:data:`tiletune.kernels.lowerings.FUSED_OPS`) are torch expressions instead."""
    pytest.importorskip("cuda.tile")
    from tiletune.kernels.lowerings import FUSED_OPS

    monkeypatch.setenv("TILETUNE_COMPILE_FUSE", "1" if fuse else "0")
    torch._dynamo.reset()
    K = public_functions()
    assert sorted(vars(K)) == sorted(PUBLIC_OPS)

    backend = CountingBackend()
    fn = torch.compile(lambda *a: public_block(K, *a), fullgraph=True, backend=backend)
    out, loss, grad, sm, ln, ge, mlp = fn(*block_inputs())
    assert len(backend.graphs) == 1
    every = EXPECTED_BLOCK_OPS + collections.Counter(
        {"cross_entropy_grad": 1, "softmax": 1, "layer_norm": 1, "geglu": 1, "matmul_swiglu": 1})
    want = collections.Counter({k: n for k, n in every.items() if not (fuse and k in FUSED_OPS)})
    assert tiletune_ops_in(backend.graphs[0]) == want
    if fuse:
        assert set(FUSED_OPS) == {"rms_norm", "rms_norm_residual", "layer_norm", "swiglu", "geglu", "apply_rope_"}
    torch._dynamo.reset()
    assert meta_of(out) == ((B, S, HID), BF16, (S * HID, HID, 1), META)
    assert meta_of(loss) == ((), F32, (), META)
    assert meta_of(grad) == ((B * S, HID), BF16, (HID, 1), META)
    assert meta_of(sm) == ((B, S, HID), BF16, (S * HID, 1, S), META)  # softmax over dim 1: moved back
    assert meta_of(ln) == ((B, S, HID), BF16, (S * HID, HID, 1), META)
    assert meta_of(ge) == ((B, S, HID // 2), BF16, (S * HID // 2, HID // 2, 1), META)
    assert meta_of(mlp) == ((B, S, FF), BF16, (S * FF, FF, 1), META)


def test_dynamic_compile_keeps_float_arguments_out_of_the_graph_inputs():
    """With ``dynamic=True`` the graph's tensor inputs are the block's nine tensors: no float (an
    ``eps`` default) became a CPU scalar tensor input, which CUDA graph trees would refuse."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(example_inputs)
        return gm.forward

    out, _, _ = torch.compile(decoder_block, fullgraph=True, dynamic=True, backend=backend)(*block_inputs())
    assert tuple(out.shape) == (B, S, HID)
    assert len(seen) == 1
    tensors = [t for t in seen[0] if isinstance(t, torch.Tensor)]
    assert len(tensors) == 9 and all(t.device.type == META for t in tensors)


# ---------------------------------------------------------------------------------------------
# decode_attention and kv_cache_append: argument mapping, fakes, a decode step under torch.compile
# ---------------------------------------------------------------------------------------------

DB, DH, DHKV, DCAP, DD = 2, 4, 2, 32, 64  # batch, query heads, kv heads, cache capacity, head dim


def decode_inputs(device=META, dtype=BF16, sq=1, t=1):
    """``(q, cache_k, cache_v, k, v)`` of a decode step: ``sq`` queries, ``t`` new tokens."""
    e = lambda *s: torch.empty(s, device=device, dtype=dtype)  # noqa: E731
    return e(DB, DH, sq, DD), e(DB, DHKV, DCAP, DD), e(DB, DHKV, DCAP, DD), e(DB, DHKV, t, DD), e(DB, DHKV, t, DD)


class _RecordingOps:
    """Stands for ``torch.ops.tiletune``: records the custom-op calls of :func:`compiled_call`."""

    def __init__(self):
        self.calls = []

    def decode_attention(self, *args):
        self.calls.append(("decode_attention", args))
        return "out"

    def kv_cache_append(self, *args):
        self.calls.append(("kv_cache_append", args))


def test_decode_compiled_call_maps_lengths_and_start(monkeypatch):
    ops = _RecordingOps()
    monkeypatch.setattr(torch_ops, "_ops", lambda: ops)
    q, ck, cv, k, v = decode_inputs()
    lens, start = empty((DB,), torch.int32), empty((DB,), torch.int64)

    assert compiled_call("decode_attention", q, ck, cv) == "out"
    compiled_call("decode_attention", q, ck, cv, 7)
    compiled_call("decode_attention", q, ck, cv, lens, False, 0.5)
    compiled_call("decode_attention", q, ck, cv, lengths=None, causal=0, scale=1)
    assert ops.calls == [
        ("decode_attention", (q, ck, cv, None, None, True, None)),
        ("decode_attention", (q, ck, cv, None, 7, True, None)),
        ("decode_attention", (q, ck, cv, lens, None, False, 0.5)),
        ("decode_attention", (q, ck, cv, None, None, False, 1.0)),
    ]
    assert type(ops.calls[-1][1][-1]) is float and type(ops.calls[-1][1][-2]) is bool

    ops.calls.clear()
    assert compiled_call("kv_cache_append", ck, cv, k, v, 3) == (ck, cv)
    got = compiled_call("kv_cache_append", ck, cv, k, v, start=start)
    assert got[0] is ck and got[1] is cv  # the public function's return: the caches themselves
    assert ops.calls == [("kv_cache_append", (ck, cv, k, v, None, 3)),
                         ("kv_cache_append", (ck, cv, k, v, start, None))]


@pytest.mark.parametrize("name, bad, message", [
    ("decode_attention", True, r"^decode_attention\(\): lengths must be an int, an integer tensor or None, got bool$"),
    ("decode_attention", 3.0, r"^decode_attention\(\): lengths must be an int, an integer tensor or None, got float$"),
    ("kv_cache_append", False, r"^kv_cache_append\(\): start must be an int or an integer tensor, got bool$"),
    ("kv_cache_append", None, r"^kv_cache_append\(\): start must be an int or an int32/int64 tensor, got NoneType$"),
    ("kv_cache_append", "0", r"^kv_cache_append\(\): start must be an int or an int32/int64 tensor, got str$"),
])
def test_decode_compiled_call_refuses_bad_lengths_and_start_as_the_eager_ops_do(name, bad, message, monkeypatch):
    q, ck, cv, k, v = decode_inputs()
    args = (q, ck, cv, bad) if name == "decode_attention" else (ck, cv, k, v, bad)
    with pytest.raises(TypeError, match=message):
        compiled_call(name, *args)
    if importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.tile") is not None:
        dec = importlib.import_module("tiletune.kernels.decode_attention_op")
        monkeypatch.setattr(dec, "check_cuda_device", lambda *a: None)  # meta tensors
        with pytest.raises(TypeError, match=message):
            getattr(dec, name)(*args)


def test_decode_attention_fake_is_a_new_tensor_like_q():
    q, ck, cv, _, _ = decode_inputs(sq=3)
    for lens in (None, 12, empty((DB,), torch.int32)):
        out = compiled_call("decode_attention", q, ck, cv, lens)
        assert meta_of(out) == meta_of(torch.empty_like(q)) == ((DB, DH, 3, DD), BF16, (DH * 3 * DD, 3 * DD, DD, 1), META)
    qt = empty((DB, 3, DH, DD), F16).transpose(1, 2)  # a transposed view in, a contiguous output out
    out = compiled_call("decode_attention", qt, ck.to(F16), cv.to(F16), causal=False, scale=0.1)
    assert meta_of(out) == ((DB, DH, 3, DD), F16, (DH * 3 * DD, 3 * DD, DD, 1), META)
    with pytest.raises(ValueError, match="give 'lengths' or 'lengths_int', not both"):
        torch.ops.tiletune.decode_attention(q, ck, cv, empty((DB,), torch.int32), 4, True, None)


def test_kv_cache_append_fake_returns_nothing_and_is_marked_mutating():
    _, ck, cv, k, v = decode_inputs(t=2)
    assert torch.ops.tiletune.kv_cache_append(ck, cv, k, v, None, 4) is None
    assert torch.ops.tiletune.kv_cache_append(ck, cv, k, v, empty((DB,), torch.int32), None) is None
    schema = torch.ops.tiletune.kv_cache_append.default._schema
    assert [a.name for a in schema.arguments if a.is_write] == ["cache_k", "cache_v"]
    assert schema.returns == [] and schema.is_mutable
    assert not torch.ops.tiletune.decode_attention.default._schema.is_mutable
    with pytest.raises(ValueError, match="give 'start' or 'start_int', not both"):
        torch.ops.tiletune.kv_cache_append(ck, cv, k, v, empty((DB,), torch.int32), 0)


def _decode_bad_calls():
    q, ck, cv, k, v = decode_inputs()
    lens = empty((DB,), torch.int32)
    return [
        ("decode_attention", (empty((DB, DH, DD)), ck, cv), ValueError, "q must be 4-D"),
        ("decode_attention", (q, ck.to(F16), cv), TypeError, "must share a dtype"),
        ("decode_attention", (q, ck, empty((DB, DHKV, 16, DD))), ValueError, "shapes differ"),
        ("decode_attention", (empty((DB, 3, 1, DD)), ck, cv), ValueError, "must be a multiple of key/value heads"),
        ("decode_attention", (q, ck, cv, 0), ValueError, r"lengths=0 is outside \[1, capacity 32\]"),
        ("decode_attention", (q, ck, cv, DCAP + 1), ValueError, r"lengths=33 is outside \[1, capacity 32\]"),
        ("decode_attention", (empty((DB, DH, 4, DD)), ck, cv, 3), ValueError,
         "lengths=3 is shorter than the 4 causal query tokens"),
        ("decode_attention", (q, ck, cv, lens.float()), TypeError, "lengths must be int32 or int64"),
        ("decode_attention", (q, ck, cv, empty((DB + 1,), torch.int32)), ValueError, r"lengths must have shape \(2,\)"),
        ("kv_cache_append", (ck, cv, empty((DB, DHKV, DD)), v, 0), ValueError, "'k' must be 4-D"),
        ("kv_cache_append", (ck, empty((DB, DHKV, 16, DD)), k, v, 0), ValueError, "cache_k .* and cache_v .* differ"),
        ("kv_cache_append", (ck, cv, k, empty((DB, DHKV, 2, DD)), 0), ValueError, "k .* and v .* differ"),
        ("kv_cache_append", (ck, cv, empty((DB, 1, 1, DD)), empty((DB, 1, 1, DD)), 0), ValueError, "do not fit caches"),
        ("kv_cache_append", (ck, cv, k.to(F16), v.to(F16), 0), TypeError, "'k' has dtype torch.float16"),
        ("kv_cache_append", (ck, cv, k, v, -1), ValueError, r"positions \[-1, 0\) do not fit the capacity 32"),
        ("kv_cache_append", (ck, cv, k, v, DCAP), ValueError, r"positions \[32, 33\) do not fit the capacity 32"),
        ("kv_cache_append", (ck, cv, k, v, lens.float()), TypeError, "start must be an int or an int32/int64 tensor"),
        ("kv_cache_append", (ck, cv, k, v, empty((1,), torch.int32)), ValueError, r"start tensor must have shape \(2,\)"),
    ]


@pytest.mark.parametrize("case", range(len(_decode_bad_calls())))
def test_decode_fakes_refuse_what_the_eager_ops_refuse(case, monkeypatch):
    """The fakes raise the eager ops' errors (type and message) on meta tensors; the eager ops (device
    check stubbed) raise the same."""
    name, args, error, message = _decode_bad_calls()[case]
    with pytest.raises(error, match=message) as got:
        compiled_call(name, *args)
    if importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.tile") is not None:
        dec = importlib.import_module("tiletune.kernels.decode_attention_op")
        monkeypatch.setattr(dec, "check_cuda_device", lambda *a: None)
        with pytest.raises(error) as eager:
            getattr(dec, name)(*args)
        assert str(eager.value) == str(got.value)


def decode_step(K, q, cache_k, cache_v, k, v, start, lengths):
    """One decode step: append the new tokens to the caches, attend over them."""
    cache_k, cache_v = K.kv_cache_append(cache_k, cache_v, k, v, start)
    return K.decode_attention(q, cache_k, cache_v, lengths)


def decode_functions():
    """``decode_attention`` and ``kv_cache_append`` from their defining module."""
    import types

    pytest.importorskip("cuda.tile")
    dec = importlib.import_module("tiletune.kernels.decode_attention_op")
    return types.SimpleNamespace(decode_attention=dec.decode_attention, kv_cache_append=dec.kv_cache_append)


#: (start, lengths) of a decode step: ints, tensors, None (the whole capacity)
STEP_ARGS = {
    "int-int": lambda d: (9, 10),
    "tensor-tensor": lambda d: (torch.zeros(DB, dtype=torch.int32, device=d), torch.ones(DB, dtype=torch.int32, device=d)),
    "int-none": lambda d: (DCAP - 1, None),
    "tensor-int": lambda d: (torch.zeros(DB, dtype=torch.int64, device=d), 5),
}
DECODE_STEP_OPS = collections.Counter({"kv_cache_append": 1, "decode_attention": 1})


@pytest.mark.parametrize("kind", list(STEP_ARGS))
def test_decode_step_of_the_public_functions_compiles_to_one_graph(kind):
    K = decode_functions()
    start, lengths = STEP_ARGS[kind](META)
    backend = CountingBackend()
    fn = torch.compile(lambda *a: decode_step(K, *a, start, lengths), fullgraph=True, backend=backend)
    out = fn(*decode_inputs())
    assert meta_of(out) == ((DB, DH, 1, DD), BF16, (DH * DD, DD, DD, 1), META)
    assert len(backend.graphs) == 1
    assert tiletune_ops_in(backend.graphs[0]) == DECODE_STEP_OPS
    explanation = torch._dynamo.explain(lambda *a: decode_step(K, *a, start, lengths))(*decode_inputs())
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    assert tiletune_ops_in(explanation.graphs[0]) == DECODE_STEP_OPS


def test_decode_step_with_changing_ints_stays_one_graph():
    """A position passed as a Python int that changes every step: after the first recompilation dynamo
    makes it a symbolic int, which the ``SymInt?`` arguments take (no recompilation per step)."""
    K = decode_functions()
    backend = CountingBackend()
    fn = torch.compile(lambda q, ck, cv, k, v, pos: decode_step(K, q, ck, cv, k, v, pos, pos + 1), fullgraph=True,
                       backend=backend)
    inputs = decode_inputs()
    for pos in range(4, 10):
        assert tuple(fn(*inputs, pos).shape) == (DB, DH, 1, DD)
    assert len(backend.graphs) <= 2
    assert all(tiletune_ops_in(g) == DECODE_STEP_OPS for g in backend.graphs)
    with pytest.raises(Exception, match=r"do not fit the capacity 32"):
        fn(*inputs, DCAP)


def test_decode_step_through_aot_autograd_functionalizes_the_append():
    """The append is wrapped by auto_functionalized, and the attention reads its outputs (the written
    caches), not the graph inputs."""
    from torch._dynamo.backends.common import aot_autograd

    K = decode_functions()
    forward_graphs = []

    def fw_compiler(gm, example_inputs):
        forward_graphs.append(gm)
        return gm.forward

    start, lengths = STEP_ARGS["tensor-tensor"](META)
    fn = torch.compile(lambda *a: decode_step(K, *a, start, lengths), fullgraph=True,
                       backend=aot_autograd(fw_compiler=fw_compiler))
    assert tuple(fn(*decode_inputs()).shape) == (DB, DH, 1, DD)
    (gm,) = forward_graphs
    assert tiletune_ops_in(gm) == collections.Counter({"decode_attention": 1})
    (wrapped,) = [n for n in gm.graph.nodes if n.op == "call_function" and "auto_functionalized" in str(n.target)]
    assert "tiletune.kv_cache_append" in str(wrapped.args[0])
    (attn,) = [n for n in gm.graph.nodes if n.op == "call_function" and "tiletune.decode_attention" in str(n.target)]
    for cache in attn.args[1:3]:
        assert cache.target is __import__("operator").getitem and cache.args[0] is wrapped


def _reference_decode(q, cache_k, cache_v, lengths=None, causal=True, scale=None):
    """Decode attention in float32 torch (any device): what the custom op's CPU stand-in computes."""
    bsz, h, sq, d = q.shape
    cap = cache_k.shape[2]
    rep = h // cache_k.shape[1]
    lens = [cap] * bsz if lengths is None else (
        [int(lengths)] * bsz if isinstance(lengths, int) else [int(x) for x in lengths.tolist()])
    out = torch.empty_like(q)
    for b, n in enumerate(lens):
        kf = cache_k[b, :, :n].float().repeat_interleave(rep, 0)
        vf = cache_v[b, :, :n].float().repeat_interleave(rep, 0)
        mask = torch.arange(n)[None, :] <= (n - sq + torch.arange(sq))[:, None] if causal else None
        out[b] = F.scaled_dot_product_attention(q[b].float(), kf, vf, attn_mask=mask, scale=scale).to(q.dtype)
    return out


@pytest.mark.parametrize("kind", ["int-int", "tensor-tensor", "tensor-int"])
def test_decode_step_runs_under_inductor_on_cpu(kind, request):
    """Inductor on CPU: the append's real implementation runs (the eager op's torch path on CPU tensors)
    and writes the caches in place (inductor re-inplaces it: no copy of the caches), then the attention,
    whose CUDA-only eager function is replaced by a torch reference here (:func:`torch_ops.bind`), reads
    the written caches."""
    K = decode_functions()
    from torch._dynamo.utils import ReinplaceCounters

    dec = importlib.import_module("tiletune.kernels.decode_attention_op")
    before = torch_ops.bind("decode_attention", _reference_decode)  # what the custom op's real impl calls
    request.addfinalizer(lambda: torch_ops.bind("decode_attention", before))
    g = torch.Generator().manual_seed(0)
    q, ck, cv, k, v = (torch.randn(t.shape, generator=g).to(BF16) for t in decode_inputs(device="cpu", t=2))
    start, lengths = STEP_ARGS[kind]("cpu")
    if isinstance(lengths, torch.Tensor):
        lengths = lengths + 1  # the two new tokens at 0 and 1: two positions seen
    want_k, want_v = ck.clone(), cv.clone()
    dec.kv_cache_append(want_k, want_v, k, v, start)
    want = _reference_decode(q, want_k, want_v, lengths)

    ReinplaceCounters.clear()
    got_k, got_v = ck.clone(), cv.clone()
    step = lambda *a: decode_step(K, *a, start, lengths)  # noqa: E731
    got = torch.compile(step, fullgraph=True, backend="inductor")(q, got_k, got_v, k, v)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert not torch.equal(got_k, ck)
    assert torch.equal(got, want)
    assert ReinplaceCounters.get_total_missed() == 0


# ---------------------------------------------------------------------------------------------
# KV caches under torch.compile(mode="reduce-overhead"): CUDA graph trees and mutated inputs
# ---------------------------------------------------------------------------------------------


def _append_stand_in(cache_k, cache_v, k, v, start):
    """kv_cache_append's writes in torch (an int start), for the real implementation on CPU."""
    t = k.shape[2]
    cache_k[:, :, start:start + t].copy_(k)
    cache_v[:, :, start:start + t].copy_(v)
    return cache_k, cache_v


class _CudagraphVerdict:
    """An Inductor backend (CPU) that records, per compiled graph, what CUDA graph trees decide on
    mutated inputs: ``check_for_mutation_ignore_cuda_graph_managed_tensor`` over the graph's mutated
    input indices and its static input indices (parameters, buffers, ``mark_static_address``).
    None: accepted; a string: "skipping cudagraphs due to mutated inputs" and where."""

    def __init__(self):
        self.verdicts = []

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner
        from torch._inductor.cudagraph_utils import check_for_mutation_ignore_cuda_graph_managed_tensor

        def inner(gm, example_inputs, **kwargs):
            out = compile_fx_inner(gm, example_inputs, **kwargs)
            static = kwargs.get("static_input_idxs", ())
            with torch._inductor.config.patch({"triton.cudagraph_trees": True}):
                self.verdicts.append(check_for_mutation_ignore_cuda_graph_managed_tensor(
                    gm, out.mutated_inputs, out.mutated_input_idxs, static))
            return out

        return compile_fx(gm, example_inputs, inner_compile=inner)


@pytest.fixture
def append_on_cpu(request):
    """The append's stand-in bound, and no compile cache (a cached graph skips ``inner_compile``)."""
    before = torch_ops.bind("kv_cache_append", _append_stand_in)
    request.addfinalizer(lambda: torch_ops.bind("kv_cache_append", before))
    with torch._inductor.config.patch(fx_graph_cache=False, fx_graph_remote_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield


def _append_step(cache_k, cache_v, k, v):
    compiled_call("kv_cache_append", cache_k, cache_v, k, v, 3)
    return k * 2


def test_kv_caches_passed_as_plain_arguments_keep_cuda_graphs_away(append_on_cpu):
    """The rule's negative half: caches that are ordinary graph inputs are mutated non-static inputs, and
    CUDA graph trees skip the graph ("skipping cudagraphs due to mutated inputs")."""
    _, ck, cv, k, v = (torch.zeros(t.shape) for t in decode_inputs(device=META, dtype=F32))
    backend = _CudagraphVerdict()
    torch.compile(_append_step, fullgraph=True, backend=backend)(ck, cv, torch.ones_like(k), torch.ones_like(v))
    assert ck[:, :, 3].eq(1).all()  # written in place
    (verdict,) = backend.verdicts
    assert verdict is not None and "mutated inputs" in verdict


def test_kv_caches_marked_static_are_accepted_by_cuda_graph_trees(append_on_cpu):
    """``mark_static_caches`` (``torch._dynamo.mark_static_address``) before the first compiled call: the
    append's mutation of the caches no longer keeps CUDA graph trees away."""
    _, ck, cv, k, v = (torch.zeros(t.shape) for t in decode_inputs(device=META, dtype=F32))
    assert torch_ops.mark_static_caches(ck, cv) == (ck, cv)
    backend = _CudagraphVerdict()
    torch.compile(_append_step, fullgraph=True, backend=backend)(ck, cv, torch.ones_like(k), torch.ones_like(v))
    assert ck[:, :, 3].eq(1).all() and cv[:, :, 3].eq(1).all()
    assert backend.verdicts == [None]


def test_kv_caches_as_module_buffers_are_accepted_by_cuda_graph_trees(append_on_cpu):
    """Caches held as buffers of the compiled module are static inputs: accepted, nothing to mark."""

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            _, ck, cv, _, _ = decode_inputs(device=META, dtype=F32)
            self.register_buffer("cache_k", torch.zeros(ck.shape))
            self.register_buffer("cache_v", torch.zeros(cv.shape))

        def forward(self, k, v):
            return _append_step(self.cache_k, self.cache_v, k, v)

    step = Step()
    _, _, _, k, v = decode_inputs(device=META, dtype=F32)
    backend = _CudagraphVerdict()
    torch.compile(step, fullgraph=True, backend=backend)(torch.ones(k.shape), torch.ones(v.shape))
    assert step.cache_k[:, :, 3].eq(1).all()
    assert backend.verdicts == [None]


# ---------------------------------------------------------------------------------------------
# the lean registration: what a call goes through (issue 43 item 1, docs/COMPILE-TAX.md)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OP_NAMES)
def test_ops_are_registered_without_python_autograd_layers(name):
    """The real implementation sits on the CUDA and CPU keys and the fake on Meta; no Autograd,
    ADInplaceOrView or CompositeExplicitAutograd kernel (the layers ``torch.library.custom_op`` adds,
    10-40 us per call in Python), and the op is no ``CustomOpDef``."""
    from torch._library.custom_ops import OPDEFS

    qual = f"tiletune::{name}"
    has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(qual, key)  # noqa: E731
    assert has("CUDA") and has("CPU") and has("Meta")
    assert not any(has(k) for k in ("Autograd", "AutogradCUDA", "AutogradCPU", "ADInplaceOrView",
                                    "CompositeExplicitAutograd", "CompositeImplicitAutograd"))
    assert qual not in OPDEFS
    assert torch.Tag.pt2_compliant_tag in getattr(torch.ops.tiletune, name).default.tags


def _trivial_rms_norm(outs):
    def rms_norm(x, weight=None, eps=1e-6):
        return outs[1] if x is outs[0] else outs[0]

    return rms_norm


@pytest.fixture
def stub_rms_norm(request):
    outs = (torch.empty(4, 8), torch.empty(4, 8))
    before = torch_ops.bind("rms_norm", _trivial_rms_norm(outs))
    request.addfinalizer(lambda: torch_ops.bind("rms_norm", before))
    return outs


def test_a_call_imports_nothing(stub_rms_norm):
    """The implementation reads its bound target: no ``import`` statement runs per call."""
    import builtins

    x, w = torch.randn(4, 8), torch.randn(8)
    op = torch.ops.tiletune.rms_norm.default
    op(x, w, 1e-6)
    seen = []
    real = builtins.__import__
    builtins.__import__ = lambda *a, **k: seen.append(a[0]) or real(*a, **k)
    try:
        for _ in range(100):
            op(x, w, 1e-6)
    finally:
        builtins.__import__ = real
    assert seen == []


def test_lean_call_costs_less_than_a_custom_op_call(stub_rms_norm):
    """Same schema, same trivial body: the registered op against a ``torch.library.custom_op`` made here
    (best of 5 batches each, interleaved; measured 6x apart on the CPU, see docs/COMPILE-TAX.md)."""
    import time

    body = _trivial_rms_norm(stub_rms_norm)

    @torch.library.custom_op("tiletune_test::rms_norm_custom_op", mutates_args=())
    def old_style(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        return body(x, weight, eps)

    x, w = torch.randn(4, 8), torch.randn(8)
    ops = {"lean": torch.ops.tiletune.rms_norm.default, "custom_op": torch.ops.tiletune_test.rms_norm_custom_op.default}
    best = {k: float("inf") for k in ops}
    for _ in range(5):
        for name, op in ops.items():
            t0 = time.perf_counter()
            for _ in range(300):
                op(x, w, 1e-6)
            best[name] = min(best[name], time.perf_counter() - t0)
    assert best["lean"] < best["custom_op"], best


def test_implementations_bind_to_the_public_fast_path():
    """The default target of an op is its public function's positional fast path (``fastcall.direct``),
    resolved once: the function behind a ``fast_op`` wrapper, never the wrapper (which would check
    ``is_compiling`` and keywords again)."""
    pytest.importorskip("cuda.tile")
    norms = importlib.import_module("tiletune.kernels.norms")
    dec = importlib.import_module("tiletune.kernels.decode_attention_op")
    assert torch_ops._resolve("rms_norm") is norms.rms_norm.fastcall.direct
    assert torch_ops._resolve("softmax") is importlib.import_module("tiletune.kernels.softmax_op").softmax.fastcall.direct
    assert torch_ops._resolve("matmul_scaled") is importlib.import_module("tiletune.kernels.gemm").matmul
    append = torch_ops._resolve("kv_cache_append")  # a start tensor: the one-launch op's fast path
    assert dec.kv_cache_append.fastcall.direct in [c.cell_contents for c in append.__closure__]
    with pytest.raises(ValueError, match="unknown target"):
        torch_ops.bind("gelu", lambda x: x)


STAND_INS = {
    "rms_norm": lambda x, weight=None, eps=1e-6: F.rms_norm(x, (x.shape[-1],), weight, eps),
    # as the eager op allocates it (Inductor asserts the fake's strides on every output)
    "softmax": lambda x, dim=-1: torch.softmax(x.movedim(dim, -1).contiguous(), -1).movedim(-1, dim),
    "swiglu": lambda x: F.silu(x[..., : x.shape[-1] // 2]) * x[..., x.shape[-1] // 2:],
    "apply_rope_": lambda q, k, cos, sin, layout="bshd": (q.mul_(2), k.mul_(3)),
}


@pytest.fixture
def stand_ins(request):
    for name, fn in STAND_INS.items():
        before = torch_ops.bind(name, fn)
        request.addfinalizer(lambda name=name, before=before: torch_ops.bind(name, before))


def cpu_block(x, w, q, k, cos, sin):
    h = compiled_call("rms_norm", x, w)
    g = compiled_call("swiglu", torch.cat([h, h], dim=-1))
    q, k = compiled_call("apply_rope_", q, k, cos, sin)
    return compiled_call("softmax", g, dim=0), q.sum() + k.sum()


def test_fullgraph_inductor_on_cpu_tensors_runs_the_bound_implementations(stand_ins):
    """``torch.compile(fullgraph=True)`` with Inductor over CPU tensors: one graph, no break, the four
    custom-op nodes, and the compiled results equal the eager ones (the stand-ins are the real
    implementations here; the in-place op is re-inplaced, its inputs written)."""
    g = torch.Generator().manual_seed(0)
    args = lambda: (torch.randn(4, 8, generator=g), torch.randn(8, generator=g), torch.randn(1, 2, 2, 4, generator=g),  # noqa: E731
                    torch.randn(1, 2, 1, 4, generator=g), torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g))
    a = args()
    want = cpu_block(*(t.clone() for t in a))
    explanation = torch._dynamo.explain(cpu_block)(*(t.clone() for t in a))
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    assert tiletune_ops_in(explanation.graphs[0]) == collections.Counter(
        {"rms_norm": 1, "swiglu": 1, "apply_rope_": 1, "softmax": 1})
    q0, k0 = a[2].clone(), a[3].clone()
    got = torch.compile(cpu_block, fullgraph=True, backend="inductor")(*a)
    torch.testing.assert_close(got, want)
    assert torch.equal(a[2], q0 * 2) and torch.equal(a[3], k0 * 3)  # the caller's q and k, written in place


def test_a_slot_resolved_on_its_first_call_passes_keywords(monkeypatch):
    """The first call through a slot resolves the target and passes keywords on (matmul with scales calls
    its target with ``scale_a=`` / ``scale_b=`` / ``out_dtype=``; a fresh process's first scaled call failed
    with an unexpected keyword on the H200 before)."""
    from tiletune.kernels import torch_ops

    seen = []
    monkeypatch.setattr(torch_ops, "_resolve", lambda name: lambda *a, **k: seen.append((name, a, k)) or "done")
    slot = torch_ops._Slot("matmul_scaled")
    assert slot.fn(1, 2, scale_a=0.5, out_dtype=None) == "done"
    assert seen == [("matmul_scaled", (1, 2), {"scale_a": 0.5, "out_dtype": None})]
