"""tiletune's library ops as ``torch.library`` custom ops (namespace ``tiletune``).

``torch.compile`` cannot trace into a cuTile launch (the tuned op reads data pointers, keys on
strides, may tune, and launches through cuTile), so under compilation each public op of
:mod:`tiletune.kernels` becomes one opaque node of the graph: a custom op whose fake (meta)
implementation gives the output's shape, dtype and strides without running anything, and whose
real implementation calls the eager public function's fast path (not compiling at run time, so it
launches the tuned kernel as usual: the learnt recipe of :mod:`tiletune.kernels.fastcall`).

Registered ops (``torch.ops.tiletune.<name>``; every output is a new tensor)::

    rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor
    rms_norm_residual(Tensor x, Tensor residual, Tensor? weight, float eps) -> (Tensor, Tensor)
    layer_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor
    softmax(Tensor x, int dim) -> Tensor
    swiglu(Tensor x) -> Tensor
    geglu(Tensor x, str approximate) -> Tensor
    apply_rope_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, str layout) -> ()
    cross_entropy(Tensor logits, Tensor target, int ignore_index) -> Tensor           # the loss
    cross_entropy_grad(Tensor logits, Tensor target, int ignore_index) -> (Tensor, Tensor)  # loss, grad
    matmul(Tensor a, Tensor b) -> Tensor
    matmul_scaled(Tensor a, Tensor b, Tensor? scale_a, Tensor? scale_b, ScalarType? out_dtype) -> Tensor
    attention(Tensor q, Tensor k, Tensor v, bool causal, float? scale) -> Tensor
    matmul_swiglu(Tensor x, Tensor w_gate_up) -> Tensor                    # swiglu(x @ w_gate_up), fused
    decode_attention(Tensor q, Tensor cache_k, Tensor cache_v, Tensor? lengths, int? lengths_int,
                     bool causal, float? scale) -> Tensor
    kv_cache_append(Tensor(a!) cache_k, Tensor(b!) cache_v, Tensor k, Tensor v, Tensor? start,
                    int? start_int) -> ()

A custom op has one return schema, so ``cross_entropy(..., return_grad=True)`` is its own op
(``cross_entropy_grad``), and so is ``matmul`` with scales or an ``out_dtype`` (``matmul_scaled``: the
plain product's op carries no ``None`` arguments through the dispatcher on every call); ``apply_rope_`` mutates ``q`` and ``k`` and returns nothing (a custom op
may not return its inputs); ``matmul_scaled``'s scales are tensors (a float scale becomes a one-element
float32 tensor first). ``decode_attention``'s ``lengths`` (None, an int or a ``(B,)`` tensor) is two
arguments, at most one of them given: ``lengths`` for a tensor, ``lengths_int`` for an int, neither
for None (the whole capacity); ``kv_cache_append``'s ``start`` (an int or a ``(B,)`` tensor) is
``start`` or ``start_int`` the same way (exactly one given). ``kv_cache_append`` mutates both caches
and returns nothing; :func:`compiled_call` returns ``(cache_k, cache_v)`` as the public function does.
(The ``int`` arguments are ``SymInt`` in the schemas, like every int of these ops: a length that
changes from call to call may become a symbolic size instead of a recompilation.)

Use :func:`compiled_call` with the public function's name and arguments (as the caller passed
them): it calls the custom op and returns what the public function returns. The public functions
route to it while compiling, first thing, before any check that reads data pointers
(``@fast_op(route=custom_op_route("rms_norm"))`` of :mod:`tiletune.kernels.fastcall` does exactly this)::

    def rms_norm(x, weight=None, eps=1e-6):
        if torch.compiler.is_compiling():
            from .torch_ops import compiled_call

            return compiled_call("rms_norm", x, weight, eps)
        ...

Importing this module imports torch only (no cuda.tile); the ops are registered once per process
at import (:func:`register` is idempotent).

**Registration (issue 43, docs/COMPILE-TAX.md).** The ops are defined the lean way, not with
``torch.library.custom_op``: ``Library.define`` with the schema above (the text ``custom_op`` inferred
before), the real implementation on the ``CUDA`` and ``CPU`` dispatch keys, the fake with
``torch.library.register_fake``, tagged ``pt2_compliant_tag``. ``custom_op`` adds Python autograd and
ADInplaceOrView kernels and output-aliasing checks to every call, which a compiled graph pays on every
node (measurements: docs/COMPILE-TAX.md). Consequences:

* **No autograd.** The ops are forward only, like the public functions: there is no backward formula,
  and a backward through one gets torch's autograd-fallback warning ("an autograd kernel was not
  registered"), not a gradient. Do not compile training graphs that need gradients through them.
* **No version-counter bump** for the tensors ``apply_rope_`` and ``kv_cache_append`` write (the kernels
  write through data pointers, as the eager functions always did); the schemas declare the writes, so
  ``torch.compile`` functionalizes and re-inplaces them as before.
* Each real implementation reads a slot bound on its first call to the public function's positional
  fast path (``fastcall``'s ``direct``: the call guard and the recipe, else the function); no import
  and no ``is_compiling`` or keyword handling per call. :func:`bind` swaps a target (tests, tools).
* Outputs are allocated by the eager path exactly as the fakes say (shape, dtype, strides); Inductor
  asserts the strides of every custom-op output against the fake.

**KV caches and CUDA graphs (``mode="reduce-overhead"``).** ``kv_cache_append`` (and ``apply_rope_``)
mutate graph inputs. CUDA graph trees accept a graph that mutates an input only if the input is
*static*: a parameter or buffer of the compiled ``nn.Module`` (or a plain tensor attribute of it), or a
tensor marked with ``torch._dynamo.mark_static_address`` (:func:`mark_static_caches`), or an output of an
earlier CUDA graph of the same tree (``torch._inductor.config.triton.cudagraph_support_input_mutation``,
on by default); otherwise the whole graph runs without CUDA graphs ("skipping cudagraphs due to mutated
inputs", ``torch/_inductor/cudagraph_utils.py``; read in torch 2.13). So: keep the
caches as module buffers, or call ``mark_static_caches(cache_k, cache_v)`` once before the first
compiled call and keep their addresses fixed (tests/test_torch_ops.py checks all three cases).
"""

import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["NAMESPACE", "OP_NAMES", "PUBLIC_OPS", "SCHEMAS", "TARGETS", "bind", "compiled_call", "mark_static_caches",
           "register"]

#: The ``torch.library`` namespace of the ops.
NAMESPACE = "tiletune"
#: Every registered custom op (``torch.ops.tiletune.<name>``).
OP_NAMES = (
    "rms_norm",
    "rms_norm_residual",
    "layer_norm",
    "softmax",
    "swiglu",
    "geglu",
    "apply_rope_",
    "cross_entropy",
    "cross_entropy_grad",
    "matmul",
    "matmul_scaled",
    "attention",
    "matmul_swiglu",
    "decode_attention",
    "kv_cache_append",
)
#: Public functions :func:`compiled_call` accepts (the names of :mod:`tiletune.kernels`).
#: Every custom op but ``cross_entropy_grad``, which serves ``cross_entropy(..., return_grad=True)``, and
#: ``matmul_scaled``, which serves ``matmul(..., scale_a=, scale_b=, out_dtype=)``.
PUBLIC_OPS = tuple(name for name in OP_NAMES if name not in ("cross_entropy_grad", "matmul_scaled"))

_LOCK = threading.Lock()
_REGISTERED = False
_FP8 = getattr(torch, "float8_e4m3fn", None)


# ---------------------------------------------------------------------------------------------
# Real implementations: the eager fast path of the public functions, bound on first use
# ---------------------------------------------------------------------------------------------

#: public op -> module of :mod:`tiletune.kernels` that defines it (imported on the first real call:
#: the modules need cuda.tile, this one must not)
_MODULES = {
    "rms_norm": "norms", "rms_norm_residual": "norms", "layer_norm": "norms", "softmax": "softmax_op",
    "swiglu": "glu", "geglu": "glu", "apply_rope_": "rope", "cross_entropy": "cross_entropy_op",
    "matmul": "gemm", "attention": "attention_op", "matmul_swiglu": "gemm_glu",
    "decode_attention": "decode_attention_op", "kv_cache_append": "decode_attention_op",
}
#: targets an op's implementation calls: every public op, plus ``matmul_scaled`` (matmul's keyword-only
#: scales and out_dtype go to the public function itself)
TARGETS = (*_MODULES, "matmul_scaled")


def _public(name: str) -> Callable[..., Any]:
    import importlib

    return getattr(importlib.import_module(f"tiletune.kernels.{_MODULES[name]}"), name)


def _direct(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A public function's fast path on positional arguments (:attr:`fastcall._FastOp.direct`: the guard,
    the recipe, else the function), or the function itself."""
    return getattr(getattr(fn, "fastcall", None), "direct", None) or fn


def _resolve(name: str) -> Callable[..., Any]:
    """The target ``name`` (:data:`TARGETS`): called with the public function's positional arguments."""
    if name == "matmul_scaled":
        return _public("matmul")
    fn = _public(name)
    if name == "kv_cache_append":
        tensor_start = _direct(fn)  # a start tensor: the one-launch op's recipe

        def append(cache_k: Tensor, cache_v: Tensor, k: Tensor, v: Tensor, start: Any,
                   _tensor: type = torch.Tensor) -> Any:
            if isinstance(start, _tensor):
                return tensor_start(cache_k, cache_v, k, v, start)
            return fn(cache_k, cache_v, k, v, start)

        return append
    return _direct(fn)


class _Slot:
    """Where an op's implementation finds its target: ``fn`` resolves it on the first call, then is it."""

    __slots__ = ("name", "fn")

    def __init__(self, name: str) -> None:
        self.name = name
        self.fn: Callable[..., Any] = self._first

    def _first(self, *args: Any, **kwargs: Any) -> Any:
        self.fn = _resolve(self.name)
        return self.fn(*args, **kwargs)


# kept over importlib.reload (which re-runs this file in the same namespace): the registered kernels of
# the first copy read these slots and keep these libraries alive
_SLOTS: Dict[str, _Slot] = globals().get("_SLOTS") or {name: _Slot(name) for name in TARGETS}
_LIBS: list = globals().get("_LIBS") or []


def bind(name: str, fn: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
    """Set what the real implementation of op ``name`` calls; returns what it called before.

    ``fn`` takes the public function's positional arguments (``decode_attention(q, cache_k, cache_v,
    lengths, causal, scale)``, ``kv_cache_append(cache_k, cache_v, k, v, start)`` ...); None goes back to
    the default, resolved on the next call: the public function's fast path
    (:func:`tiletune.kernels.fastcall.fast_op`). ``matmul_scaled`` is matmul with scales or an
    ``out_dtype`` (called with them as keywords). For tests and tools (a stand-in on a machine without
    the kernel); the ops themselves bind their defaults lazily, on the first real call."""
    slot = _SLOTS.get(name)
    if slot is None:
        raise ValueError(f"bind: unknown target {name!r}; one of {', '.join(TARGETS)}")
    before = slot.fn
    slot.fn = slot._first if fn is None else fn
    return before


def _one_of(op: str, name: str, as_tensor: Optional[Tensor], as_int: Optional[int]) -> Any:
    """The public argument ``name`` back from its two custom-op arguments (a tensor, or an int)."""
    if as_tensor is not None and as_int is not None:
        raise ValueError(f"{op}: give '{name}' or '{name}_int', not both")
    return as_tensor if as_tensor is not None else as_int


def _kernels(slots: Dict[str, _Slot]) -> Dict[str, Callable[..., Any]]:
    """Each op's real implementation: the custom op's arguments to its target's, the target's result to
    the schema's returns (nothing for the in-place ops, a tuple for two outputs). No import, no check,
    no lookup beyond the slot: the target (the eager fast path) checks."""
    s = {name: slots[name] for name in TARGETS}
    rms, rms_res, ln, sm = s["rms_norm"], s["rms_norm_residual"], s["layer_norm"], s["softmax"]
    sw, ge, rope, ce = s["swiglu"], s["geglu"], s["apply_rope_"], s["cross_entropy"]
    mm, mm_scaled, attn, mm_sw = s["matmul"], s["matmul_scaled"], s["attention"], s["matmul_swiglu"]
    dec, app = s["decode_attention"], s["kv_cache_append"]

    def rms_norm(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
        return rms.fn(x, weight, eps)

    def rms_norm_residual(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor]:
        y, h = rms_res.fn(x, residual, weight, eps)
        return y, h

    def layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
        return ln.fn(x, weight, bias, eps)

    def softmax(x: Tensor, dim: int) -> Tensor:
        return sm.fn(x, dim)

    def swiglu(x: Tensor) -> Tensor:
        return sw.fn(x)

    def geglu(x: Tensor, approximate: str) -> Tensor:
        return ge.fn(x, approximate)

    def apply_rope_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, layout: str) -> None:
        rope.fn(q, k, cos, sin, layout)

    def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor:
        return ce.fn(logits, target, False, ignore_index)

    def cross_entropy_grad(logits: Tensor, target: Tensor, ignore_index: int) -> Tuple[Tensor, Tensor]:
        loss, grad = ce.fn(logits, target, True, ignore_index)
        return loss, grad

    def matmul(a: Tensor, b: Tensor) -> Tensor:
        return mm.fn(a, b)  # positional only: the op's per-signature fast path applies

    def matmul_scaled(a: Tensor, b: Tensor, scale_a: Optional[Tensor], scale_b: Optional[Tensor],
                      out_dtype: Optional[torch.dtype]) -> Tensor:
        return mm_scaled.fn(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)

    def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float]) -> Tensor:
        return attn.fn(q, k, v, causal, scale)

    def matmul_swiglu(x: Tensor, w_gate_up: Tensor) -> Tensor:
        return mm_sw.fn(x, w_gate_up)

    def decode_attention(q: Tensor, cache_k: Tensor, cache_v: Tensor, lengths: Optional[Tensor],
                         lengths_int: Optional[int], causal: bool, scale: Optional[float]) -> Tensor:
        if lengths is None:
            return dec.fn(q, cache_k, cache_v, lengths_int, causal, scale)
        return dec.fn(q, cache_k, cache_v, _one_of("decode_attention()", "lengths", lengths, lengths_int),
                      causal, scale)

    def kv_cache_append(cache_k: Tensor, cache_v: Tensor, k: Tensor, v: Tensor, start: Optional[Tensor],
                        start_int: Optional[int]) -> None:
        if start is None:
            app.fn(cache_k, cache_v, k, v, start_int)
        else:
            app.fn(cache_k, cache_v, k, v, _one_of("kv_cache_append()", "start", start, start_int))

    return {name: fn for name, fn in locals().items() if name in OP_NAMES}


# ---------------------------------------------------------------------------------------------
# Fake (meta) implementations: output metadata only, exactly as the eager functions allocate it
# ---------------------------------------------------------------------------------------------


def _check_last_dim(op: str, x: Tensor) -> None:
    if x.dim() < 1:
        raise ValueError(f"{op}(): the input must have at least one dimension, got a 0-d tensor")


def _rms_norm_fake(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    _check_last_dim("rms_norm", x)
    return x.new_empty(x.shape)


def _rms_norm_residual_fake(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor]:
    _check_last_dim("rms_norm_residual", x)
    torch._check(tuple(residual.shape) == tuple(x.shape),
                 lambda: f"rms_norm_residual(): 'residual' must have the shape of 'x' {tuple(x.shape)}, "
                         f"got {tuple(residual.shape)}")
    return x.new_empty(x.shape), x.new_empty(x.shape)


def _layer_norm_fake(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    _check_last_dim("layer_norm", x)
    return x.new_empty(x.shape)


def _softmax_fake(x: Tensor, dim: int) -> Tensor:
    _check_last_dim("softmax", x)
    nd = x.dim()
    if not -nd <= dim < nd:
        raise ValueError(f"softmax(): dim {dim!r} is out of range for a {nd}-d input")
    dim = dim % nd
    if dim == nd - 1:
        return x.new_empty(x.shape)
    # the eager op normalizes x.movedim(dim, -1) into a new contiguous tensor and moves the dim back
    moved = list(x.shape)
    moved.append(moved.pop(dim))
    return x.new_empty(moved).movedim(-1, dim)


def _glu_fake(x: Tensor) -> Tensor:
    if x.dim() < 1:
        raise ValueError("the input of a gated activation must have at least one dimension")
    torch._check(x.shape[-1] % 2 == 0,
                 lambda: f"the last dimension must be even (gate and up halves), got shape {tuple(x.shape)}")
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _swiglu_fake(x: Tensor) -> Tensor:
    return _glu_fake(x)


def _geglu_fake(x: Tensor, approximate: str) -> Tensor:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"geglu(): approximate must be 'none' or 'tanh', got {approximate!r}")
    return _glu_fake(x)


def _apply_rope_fake(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, layout: str) -> None:
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"apply_rope_(): layout must be 'bshd' or 'bhsd', got {layout!r}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"apply_rope_(): q and k must be 4-D, got {tuple(q.shape)} and {tuple(k.shape)}")
    return None


def _cross_entropy_fake(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    if logits.dim() < 1:
        raise ValueError("cross_entropy(): 'logits' must have a class (last) dimension")
    return logits.new_empty((), dtype=torch.float32)


def _cross_entropy_grad_fake(logits: Tensor, target: Tensor, ignore_index: int) -> Tuple[Tensor, Tensor]:
    return _cross_entropy_fake(logits, target, ignore_index), logits.new_empty(logits.shape)


def matmul_out_dtype(a: Tensor, b: Tensor, scale_a: Optional[Tensor], scale_b: Optional[Tensor],
                     out_dtype: Optional[torch.dtype]) -> torch.dtype:
    """The result dtype of ``matmul`` (the eager op's dtype rules and refusals)."""
    if a.dtype != b.dtype:
        raise TypeError(f"matmul expects two tensors of one dtype, got {a.dtype} and {b.dtype}")
    if _FP8 is not None and a.dtype == _FP8:
        if scale_a is None or scale_b is None:
            raise ValueError("matmul: float8_e4m3fn inputs need scale_a and scale_b (per-tensor scales)")
        out = torch.bfloat16 if out_dtype is None else out_dtype
        if out not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"matmul: out_dtype of an fp8 product must be bfloat16, float16 or float32, got {out}")
        return out
    if a.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"matmul supports bfloat16, float16, float32 and float8_e4m3fn, got {a.dtype}")
    if scale_a is not None or scale_b is not None:
        raise ValueError("matmul: scale_a / scale_b are for float8_e4m3fn inputs only")
    if out_dtype is not None and out_dtype != a.dtype:
        raise TypeError(f"matmul: out_dtype must be the inputs' dtype ({a.dtype}) for non-fp8 inputs")
    return a.dtype


def matmul_out_shape(a_shape: Tuple[Any, ...], b_shape: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """``torch.matmul``'s result shape: 1-D operands, ``(..., M, K) @ (K, N)``, broadcast batch dims."""
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ValueError("matmul: both arguments need at least one dimension")
    if len(a_shape) == 1:
        a_batch, m, ka = (), (), a_shape[0]
    else:
        a_batch, m, ka = tuple(a_shape[:-2]), (a_shape[-2],), a_shape[-1]
    if len(b_shape) == 1:
        b_batch, n, kb = (), (), b_shape[0]
    else:
        b_batch, n, kb = tuple(b_shape[:-2]), (b_shape[-1],), b_shape[-2]
    torch._check(ka == kb, lambda: f"matmul: inner dimensions differ: {tuple(a_shape)} @ {tuple(b_shape)}")
    batch = tuple(torch.broadcast_shapes(a_batch, b_batch))
    return (*batch, *m, *n)


def _matmul_scaled_fake(a: Tensor, b: Tensor, scale_a: Optional[Tensor], scale_b: Optional[Tensor],
                        out_dtype: Optional[torch.dtype]) -> Tensor:
    dtype = matmul_out_dtype(a, b, scale_a, scale_b, out_dtype)
    return a.new_empty(matmul_out_shape(tuple(a.shape), tuple(b.shape)), dtype=dtype)


def _matmul_fake(a: Tensor, b: Tensor) -> Tensor:
    return _matmul_scaled_fake(a, b, None, None, None)


def _attention_fake(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float]) -> Tensor:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must be 4-D (B, H, S, D), got shape {tuple(t.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return q.new_empty(q.shape)


def _matmul_swiglu_fake(x: Tensor, w_gate_up: Tensor) -> Tensor:
    """``[..., N]`` of ``x``'s dtype for ``x [..., K]`` and ``w_gate_up [K, 2N]``, contiguous (the eager
    op views a new ``M x N`` tensor), with the eager op's refusals (shape ones through ``torch._check``
    with its message where the sizes may be symbolic)."""
    op = "matmul_swiglu"
    for name, t in (("x", x), ("w_gate_up", w_gate_up)):
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"{op}(): '{name}' must be bfloat16 or float16, got {str(t.dtype).replace('torch.', '')}")
    if x.dtype != w_gate_up.dtype:
        raise TypeError(f"{op}(): 'x' is {str(x.dtype).replace('torch.', '')} but 'w_gate_up' is "
                        f"{str(w_gate_up.dtype).replace('torch.', '')}; they must match")
    if x.dim() < 1:
        raise ValueError(f"{op}(): 'x' must have at least one dimension ([..., K]), got a scalar")
    if w_gate_up.dim() != 2:
        raise ValueError(f"{op}(): 'w_gate_up' must be 2-D [K, 2N], got shape {tuple(w_gate_up.shape)}")
    n2 = w_gate_up.shape[1]
    torch._check_with(ValueError, n2 >= 2 and n2 % 2 == 0,
                      lambda: f"{op}(): 'w_gate_up' must have an even number of columns >= 2 (gate and up "
                              f"halves), got shape {tuple(w_gate_up.shape)}")
    torch._check_with(ValueError, x.shape[-1] == w_gate_up.shape[0],
                      lambda: f"{op}(): inner dimensions differ: x {tuple(x.shape)} @ w_gate_up "
                              f"{tuple(w_gate_up.shape)}")
    return x.new_empty((*x.shape[:-1], n2 // 2))


_DECODE_NAMES = ("q", "cache_k", "cache_v")


def _decode_attention_fake(q: Tensor, cache_k: Tensor, cache_v: Tensor, lengths: Optional[Tensor],
                           lengths_int: Optional[int], causal: bool, scale: Optional[float]) -> Tensor:
    """A new contiguous tensor like ``q`` (the eager op's output), with the eager op's shape, dtype and
    ``lengths`` refusals (the head dim, the query count and the device are left to the real call)."""
    from tiletune.kernels._attention_checks import check_kv_shapes, check_lengths, check_qkv_tensors

    op = "decode_attention()"
    lens = _one_of(op, "lengths", lengths, lengths_int)
    check_qkv_tensors(op, _DECODE_NAMES, q, cache_k, cache_v)
    check_kv_shapes(op, _DECODE_NAMES, q, cache_k, cache_v)
    check_lengths(op, lens, q.shape[0], cache_k.shape[2], q.shape[2], causal, require=torch._check_with)
    return q.new_empty(q.shape)


def _kv_cache_append_fake(cache_k: Tensor, cache_v: Tensor, k: Tensor, v: Tensor, start: Optional[Tensor],
                          start_int: Optional[int]) -> None:
    """Nothing (the caches are written in place), with the eager op's shape, dtype and ``start`` refusals
    (the device is left to the real call)."""
    from tiletune.kernels._attention_checks import check_append

    op = "kv_cache_append()"
    check_append(op, cache_k, cache_v, k, v, _one_of(op, "start", start, start_int), devices=False,
                 require=torch._check_with)
    return None


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------

#: name -> schema (after ``tiletune::<name>``): the schemas ``torch.library.custom_op`` inferred when the
#: ops were registered that way (same argument names, ``SymInt`` ints, ``a0``/``a1`` alias sets), but for
#: ``matmul``, split since into the plain product and ``matmul_scaled``
SCHEMAS: Dict[str, str] = {
    "rms_norm": "(Tensor x, Tensor? weight, float eps) -> Tensor",
    "rms_norm_residual": "(Tensor x, Tensor residual, Tensor? weight, float eps) -> (Tensor, Tensor)",
    "layer_norm": "(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor",
    "softmax": "(Tensor x, SymInt dim) -> Tensor",
    "swiglu": "(Tensor x) -> Tensor",
    "geglu": "(Tensor x, str approximate) -> Tensor",
    "apply_rope_": "(Tensor(a0!) q, Tensor(a1!) k, Tensor cos, Tensor sin, str layout) -> ()",
    "cross_entropy": "(Tensor logits, Tensor target, SymInt ignore_index) -> Tensor",
    "cross_entropy_grad": "(Tensor logits, Tensor target, SymInt ignore_index) -> (Tensor, Tensor)",
    "matmul": "(Tensor a, Tensor b) -> Tensor",
    "matmul_scaled": "(Tensor a, Tensor b, Tensor? scale_a, Tensor? scale_b, ScalarType? out_dtype) -> Tensor",
    "attention": "(Tensor q, Tensor k, Tensor v, bool causal, float? scale) -> Tensor",
    "matmul_swiglu": "(Tensor x, Tensor w_gate_up) -> Tensor",
    "decode_attention": "(Tensor q, Tensor cache_k, Tensor cache_v, Tensor? lengths, SymInt? lengths_int, "
                        "bool causal, float? scale) -> Tensor",
    "kv_cache_append": "(Tensor(a0!) cache_k, Tensor(a1!) cache_v, Tensor k, Tensor v, Tensor? start, "
                       "SymInt? start_int) -> ()",
}

#: name -> fake (meta) implementation
_FAKES: Dict[str, Callable[..., Any]] = {
    "rms_norm": _rms_norm_fake,
    "rms_norm_residual": _rms_norm_residual_fake,
    "layer_norm": _layer_norm_fake,
    "softmax": _softmax_fake,
    "swiglu": _swiglu_fake,
    "geglu": _geglu_fake,
    "apply_rope_": _apply_rope_fake,
    "cross_entropy": _cross_entropy_fake,
    "cross_entropy_grad": _cross_entropy_grad_fake,
    "matmul": _matmul_fake,
    "matmul_scaled": _matmul_scaled_fake,
    "attention": _attention_fake,
    "matmul_swiglu": _matmul_swiglu_fake,
    "decode_attention": _decode_attention_fake,
    "kv_cache_append": _kv_cache_append_fake,
}

#: dispatch keys the real implementations are registered for (CPU: the stand-ins of the CPU tests, and
#: kv_cache_append's torch path; the other public functions refuse CPU tensors themselves)
BACKEND_KEYS = ("CUDA", "CPU")


def _exists(name: str) -> bool:
    """Whether ``tiletune::<name>`` is already defined in this process (by an earlier copy of this module)."""
    return hasattr(getattr(torch.ops, NAMESPACE), name)


def register() -> None:
    """Define every op of :data:`OP_NAMES` with its real and fake implementation (once per process).

    The lean registration: ``Library.define`` with the schema, the real implementation for the
    :data:`BACKEND_KEYS`, the fake with ``torch.library.register_fake``; no Python autograd or
    ADInplaceOrView kernel (see the module docstring). Idempotent and thread-safe; an op already
    defined under ``tiletune::`` (a reloaded copy of this module defined it) is left as it is.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    with _LOCK:
        if _REGISTERED:
            return
        kernels = _kernels(_SLOTS)
        lib = None
        for name in OP_NAMES:
            if _exists(name):
                continue
            if lib is None:
                lib = torch.library.Library(NAMESPACE, "FRAGMENT")  # FRAGMENT: a reload may add to it
                _LIBS.append(lib)  # a Library's registrations live as long as the object
            lib.define(name + SCHEMAS[name], tags=(torch.Tag.pt2_compliant_tag,))
            for key in BACKEND_KEYS:
                lib.impl(name, kernels[name], key)
            torch.library.register_fake(f"{NAMESPACE}::{name}", _FAKES[name], lib=lib)
        _REGISTERED = True
# ---------------------------------------------------------------------------------------------
# compiled_call: the public signatures over the custom ops
# ---------------------------------------------------------------------------------------------


def _ops() -> Any:
    return getattr(torch.ops, NAMESPACE)


# Float defaults are written in the bodies (``eps=None``): dynamo may make a float that is a
# function default a graph input (a CPU scalar tensor when floats are not specialized), which
# would also keep CUDA graph trees away; a literal in the body is a constant of the graph.


def _call_rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: Optional[float] = None) -> Tensor:
    return _ops().rms_norm(x, weight, 1e-6 if eps is None else float(eps))


def _call_rms_norm_residual(x: Tensor, residual: Tensor, weight: Optional[Tensor] = None,
                            eps: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    y, h = _ops().rms_norm_residual(x, residual, weight, 1e-6 if eps is None else float(eps))
    return y, h


def _call_layer_norm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                     eps: Optional[float] = None) -> Tensor:
    return _ops().layer_norm(x, weight, bias, 1e-5 if eps is None else float(eps))


def _call_softmax(x: Tensor, dim: int = -1) -> Tensor:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise ValueError(f"softmax(): dim {dim!r} is out of range for a {x.dim()}-d input")
    return _ops().softmax(x, dim)


def _call_swiglu(x: Tensor) -> Tensor:
    return _ops().swiglu(x)


def _call_geglu(x: Tensor, approximate: str = "none") -> Tensor:
    return _ops().geglu(x, approximate)


def _call_apply_rope_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, layout: str = "bshd") -> Tuple[Tensor, Tensor]:
    _ops().apply_rope_(q, k, cos, sin, layout)
    return q, k


def _call_cross_entropy(logits: Tensor, target: Tensor, return_grad: bool = False, ignore_index: int = -100) -> Any:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"cross_entropy(): 'ignore_index' must be an int, got {type(ignore_index).__name__}")
    if return_grad:
        loss, grad = _ops().cross_entropy_grad(logits, target, ignore_index)
        return loss, grad
    return _ops().cross_entropy(logits, target, ignore_index)


def _scale_arg(s: Any, name: str, like: Tensor) -> Optional[Tensor]:
    """A matmul scale as the custom op takes it: None, a tensor, or a float made a 1-element tensor."""
    if s is None or isinstance(s, torch.Tensor):
        return s
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        return torch.full((1,), float(s), dtype=torch.float32, device=like.device)
    raise TypeError(f"matmul: {name} must be a float or a one-element tensor, got {type(s).__name__}")


def _call_matmul(a: Tensor, b: Tensor, *, scale_a: Any = None, scale_b: Any = None,
                 out_dtype: Optional[torch.dtype] = None) -> Tensor:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise TypeError("matmul expects two torch tensors")
    if scale_a is None and scale_b is None and out_dtype is None:
        return _ops().matmul(a, b)
    return _ops().matmul_scaled(a, b, _scale_arg(scale_a, "scale_a", a), _scale_arg(scale_b, "scale_b", a),
                                out_dtype)


def _call_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None) -> Tensor:
    return _ops().attention(q, k, v, bool(causal), None if scale is None else float(scale))


def _call_matmul_swiglu(x: Tensor, w_gate_up: Tensor) -> Tensor:
    return _ops().matmul_swiglu(x, w_gate_up)


def _int_or_tensor(op: str, name: str, x: Any, what: str, other: Optional[str] = None,
                   allow_none: bool = True) -> Tuple[Optional[Tensor], Optional[int]]:
    """``(tensor, None)``, ``(None, int)`` or ``(None, None)`` for a tensor, an int (a symbolic one while
    compiling) or None; the eager op's ``TypeError`` for a bool (``... must be <what>, got bool``) and any
    other type (``... must be <other or what>, got <type>``)."""
    if isinstance(x, torch.Tensor) or (x is None and allow_none):
        return x, None
    if isinstance(x, bool):
        raise TypeError(f"{op}: {name} must be {what}, got bool")
    if isinstance(x, (int, torch.SymInt)):
        return None, x
    raise TypeError(f"{op}: {name} must be {other or what}, got {type(x).__name__}")


def _call_decode_attention(q: Tensor, cache_k: Tensor, cache_v: Tensor, lengths: Any = None, causal: bool = True,
                           scale: Optional[float] = None) -> Tensor:
    lens, lens_int = _int_or_tensor("decode_attention()", "lengths", lengths,
                                    "an int, an integer tensor or None")
    return _ops().decode_attention(q, cache_k, cache_v, lens, lens_int, bool(causal),
                                   None if scale is None else float(scale))


def _call_kv_cache_append(cache_k: Tensor, cache_v: Tensor, k: Tensor, v: Tensor, start: Any) -> Tuple[Tensor, Tensor]:
    s, s_int = _int_or_tensor("kv_cache_append()", "start", start, "an int or an integer tensor",
                              "an int or an int32/int64 tensor", allow_none=False)
    _ops().kv_cache_append(cache_k, cache_v, k, v, s, s_int)
    return cache_k, cache_v


_ROUTES: Dict[str, Callable[..., Any]] = {
    "rms_norm": _call_rms_norm,
    "rms_norm_residual": _call_rms_norm_residual,
    "layer_norm": _call_layer_norm,
    "softmax": _call_softmax,
    "swiglu": _call_swiglu,
    "geglu": _call_geglu,
    "apply_rope_": _call_apply_rope_,
    "cross_entropy": _call_cross_entropy,
    "matmul": _call_matmul,
    "attention": _call_attention,
    "matmul_swiglu": _call_matmul_swiglu,
    "decode_attention": _call_decode_attention,
    "kv_cache_append": _call_kv_cache_append,
}


def compiled_call(name: str, *args: Any, **kwargs: Any) -> Any:
    """Call the public op ``name`` of :mod:`tiletune.kernels` through its custom op(s).

    Takes the public function's arguments (same names and defaults) and returns what it returns:
    ``apply_rope_`` returns ``(q, k)`` after the in-place op, ``kv_cache_append`` ``(cache_k, cache_v)``
    after it, ``cross_entropy`` the loss or
    ``(loss, grad)``, ``rms_norm_residual`` ``(y, h)``. Meant for the public functions while
    ``torch.compiler.is_compiling()`` (the op becomes one graph node); callable eagerly too.
    """
    route = _ROUTES.get(name)
    if route is None:
        raise ValueError(f"compiled_call: unknown op {name!r}; one of {', '.join(PUBLIC_OPS)}")
    return route(*args, **kwargs)


def mark_static_caches(*caches: Tensor) -> Tuple[Tensor, ...]:
    """Mark KV caches (or any tensor a tiletune op mutates) as static inputs of ``torch.compile``; returns them.

    ``torch._dynamo.mark_static_address`` on each: CUDA graph trees (``mode="reduce-overhead"``) then
    accept the graph that mutates them in place (``kv_cache_append``, ``apply_rope_`` on a persistent
    tensor) instead of skipping it for "mutated inputs". Call it once, before the first compiled call, on
    caches passed to the compiled function as arguments; caches held as buffers (or plain tensor
    attributes) of the compiled ``nn.Module`` are static already. The addresses must stay the same
    from call to call (a cache that moves is re-recorded)."""
    for c in caches:
        torch._dynamo.mark_static_address(c)
    return caches


register()
