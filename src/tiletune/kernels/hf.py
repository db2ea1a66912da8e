"""Put tiletune's ops into a Hugging Face ``transformers`` model without rewriting it (Llama, Qwen2).

Usage::

    import tiletune.kernels.hf as tthf

    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, device_map="cuda")
    report = tthf.apply_tiletune(model)          # dispatches on model.config.model_type
    with torch.inference_mode():
        out = model.generate(**inputs)            # RMSNorm, RoPE, SwiGLU, attention: tiletune ops
    report.revert()                               # back to the model as it was

    tthf.apply_tiletune_to_llama()                # no model: patch the modeling classes, so models
    model = LlamaForCausalLM.from_pretrained(...) # built afterwards use the ops (like Liger-Kernel)

``apply_tiletune_to_llama(model=None, *, rms_norm=True, rope=True, swiglu=True, attention=True)``
(and ``apply_tiletune_to_qwen2``, same arguments) returns a :class:`PatchReport`: what was patched,
what was not and why, and ``revert()``.

What is replaced, and by what:

* **RMSNorm** modules: ``forward`` -> :func:`tiletune.kernels.rms_norm` (same ``eps``).
* **RoPE**: the modeling module's ``apply_rotary_pos_emb`` -> :func:`tiletune.kernels.apply_rope_`, which
  rotates the fresh projection outputs ``q`` and ``k`` in place (Hugging Face's layout ``(B, H, S, D)``
  and its ``(B or 1, S, D)`` cos/sin, rotate-half convention: nothing to convert). This runs before the
  cache update, so the cache stores the rotated keys, as without the patch. The function is a module
  global of ``modeling_llama`` / ``modeling_qwen2``: patching one model instance patches it for every
  model of that type in the process (same result; the fallback below keeps other devices exact).
* **MLP**: ``forward`` -> ``down_proj(K.swiglu(x @ [gate; up]^T))``: one GEMM of the gate and up
  projections, whose weights are moved into one ``(2I, H)`` buffer the first time the MLP runs on a GPU
  (``gate_proj.weight`` and ``up_proj.weight`` become views of it: no extra memory; ``revert()`` gives
  them separate storage again).
* **Attention**: registered as ``attn_implementation="tiletune"`` (with the SDPA mask function), set on
  the model's config. Hugging Face updates the KV cache before calling it, so it sees the full keys:
  prefill (causal, grouped-query heads) and decode (one or a few new tokens over the cache) run
  :func:`tiletune.kernels.attention` (which sends short queries to the split-KV decode kernels).
  Without a model, models built afterwards whose attention implementation is the default ``"sdpa"``
  get ``"tiletune"``; ``from_pretrained(..., attn_implementation="tiletune")`` also works.

Every patched call decides, cheaply and per call, whether the op covers it, and otherwise runs the
original code (attention: torch's SDPA path): tensors not on a CUDA device, autograd needing
gradients (the ops are forward only: run under ``torch.no_grad()`` / ``torch.inference_mode()``, as
``generate`` does), dtypes the op does not take, attention masks (padding, static caches in decode,
sliding windows that bite), dropout, head dims other than 64 and 128, ``output_attentions``. Two
cases where ``transformers`` itself builds a mask: decode with a ``StaticCache``, and a compiled forward
without a cache (its packed-sequence check); with a ``DynamicCache`` (``generate``'s default) neither.

Under ``torch.compile`` the patched forwards trace without a graph break (no check reads a data pointer
or calls a function Dynamo cannot trace): each op is one ``torch.ops.tiletune`` node of the model's graph
(:mod:`tiletune.kernels.torch_ops`). Run one eager patched call first (it fuses the gate/up weights; a
compiled graph never re-lays them and runs the original MLP until then).

The first call with a new shape tunes the op (see :func:`tiletune.autotune`); warm the shapes you serve
(or use ``tiletune tune --model``) before timing.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F

import tiletune.kernels as K  # the package only: each op loads (with cuda.tile) at its first use

__all__ = ["ATTN_IMPLEMENTATION", "PatchReport", "SUPPORTED_MODEL_TYPES", "apply_tiletune",
           "apply_tiletune_to_llama", "apply_tiletune_to_qwen2"]

#: The name the attention function is registered under in ``transformers``' attention interface.
ATTN_IMPLEMENTATION = "tiletune"

# What the ops take (module globals so a CPU test can widen them while the ops are reference stand-ins).
_DEVICE_TYPES: tuple[str, ...] = ("cuda",)
_FLOAT_DTYPES: tuple[Any, ...] = (torch.bfloat16, torch.float16, torch.float32)
_ATTN_DTYPES: tuple[Any, ...] = (torch.bfloat16, torch.float16)
_ATTN_HEAD_DIMS: tuple[int, ...] = (64, 128)

_MARK = "_tiletune_original"  # attribute of every replacement function: the function it replaced


def _on_device(t: Any) -> bool:
    return t.device.type in _DEVICE_TYPES


def _needs_grad(*ts: Any) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


# ---------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------


def _rms_covers(x: Any, w: Any) -> bool:
    return (_on_device(x) and x.dtype in _FLOAT_DTYPES and w is not None and w.dtype == x.dtype
            and w.device == x.device and w.dim() == 1 and x.shape[-1] == w.shape[0] and not _needs_grad(x, w))


def _make_rms_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    def forward(self: Any, hidden_states: Any) -> Any:
        w = self.weight
        if _rms_covers(hidden_states, w):
            eps = getattr(self, "variance_epsilon", None)
            if eps is None:
                eps = getattr(self, "eps", 1e-6)
            return K.rms_norm(hidden_states, w, eps)
        return original(self, hidden_states)

    setattr(forward, _MARK, original)
    forward.__name__ = "tiletune_rms_norm_forward"
    return forward


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------


def _rope_layout(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any) -> str | None:
    """``"bhsd"`` / ``"bshd"`` when :func:`tiletune.kernels.apply_rope_` covers the call, else None."""
    if unsqueeze_dim not in (1, 2) or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3:
        return None
    if not (_on_device(q) and q.dtype in _FLOAT_DTYPES and k.dtype == q.dtype and cos.dtype in _FLOAT_DTYPES):
        return None
    if k.device != q.device or cos.device != q.device or sin.device != q.device or cos.shape != sin.shape:
        return None
    if q.stride(-1) != 1 or k.stride(-1) != 1 or _needs_grad(q, k, cos, sin):
        return None
    s_dim = 3 - unsqueeze_dim  # the sequence dim of q: 2 for (B, H, S, D), 1 for (B, S, H, D)
    bsz, s, d = q.shape[0], q.shape[s_dim], q.shape[-1]
    if (cos.shape[0] not in (1, bsz) or cos.shape[1] != s or cos.shape[2] != d or k.shape[0] != bsz
            or k.shape[s_dim] != s or k.shape[-1] != d):
        return None
    # q and k sharing memory would be rotated twice. Eagerly: compare the data pointers. While compiling: only
    # whether they are one tensor (Dynamo cannot trace a comparison of two data pointers: a graph break in
    # every attention layer, docs/COMPILE-TAX.md); the patched models pass two projections' fresh outputs.
    if q is k or (not torch.compiler.is_compiling() and q.data_ptr() == k.data_ptr()):
        return None
    return "bhsd" if unsqueeze_dim == 1 else "bshd"


def _make_rope(original: Callable[..., Any]) -> Callable[..., Any]:
    params = list(inspect.signature(original).parameters)
    ud_index = params.index("unsqueeze_dim") if "unsqueeze_dim" in params else None

    def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any) -> Any:
        unsqueeze_dim = kwargs.get("unsqueeze_dim", 1)
        if args:  # 4.x signatures have position_ids (unused) before unsqueeze_dim
            if ud_index is None:
                return original(q, k, cos, sin, *args, **kwargs)
            if len(args) > ud_index - 4:
                unsqueeze_dim = args[ud_index - 4]
        layout = _rope_layout(q, k, cos, sin, unsqueeze_dim)
        if layout is None:
            return original(q, k, cos, sin, *args, **kwargs)
        # q and k are the projections' fresh outputs (not yet in the cache): rotating them in place is safe
        K.apply_rope_(q, k, cos, sin, layout=layout)
        return q, k

    setattr(apply_rotary_pos_emb, _MARK, original)
    return apply_rotary_pos_emb


# ---------------------------------------------------------------------------------------------
# SwiGLU MLP
# ---------------------------------------------------------------------------------------------

_FUSED = "_tiletune_gate_up"  # instance attribute of a patched MLP: the (2I, H) weight its gate/up views share


def _is_silu(mlp: Any) -> bool:
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    if act is not None:
        return act in ("silu", "swish")
    return type(getattr(mlp, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")


def _views_of(w: Any, g: Any, u: Any) -> bool:
    """Whether ``g`` and ``u`` are still the two halves of ``w`` (eager check)."""
    return (g.data_ptr() == w.data_ptr() and u.data_ptr() == w.data_ptr() + g.numel() * g.element_size()
            and g.shape[0] * 2 == w.shape[0])


def _fuse_gate_up(mlp: Any) -> Any:
    """Move ``gate_proj.weight`` and ``up_proj.weight`` into one ``(2I, H)`` tensor (their data become views)."""
    g, u = mlp.gate_proj.weight, mlp.up_proj.weight
    with torch.inference_mode(False), torch.no_grad():  # ordinary tensors even in an inference-mode call
        w = torch.cat([g.detach(), u.detach()], 0)
        g.data = w[: g.shape[0]]
        u.data = w[g.shape[0]:]
    object.__setattr__(mlp, _FUSED, w)
    return w


def _unfuse_gate_up(mlp: Any) -> None:
    w = mlp.__dict__.pop(_FUSED, None)
    if w is None:
        return
    g, u = mlp.gate_proj.weight, mlp.up_proj.weight
    with torch.inference_mode(False), torch.no_grad():
        if _views_of(w, g, u):
            g.data = g.detach().clone()
            u.data = u.detach().clone()


def _gate_up_weight(mlp: Any, x: Any) -> Any:
    """The fused ``(2I, H)`` gate-up weight when the tiletune path covers this call, else None."""
    gp, up = mlp.gate_proj, mlp.up_proj
    g, u = gp.weight, up.weight
    if not (_on_device(x) and x.dtype in _FLOAT_DTYPES and g.dtype == x.dtype and u.dtype == x.dtype
            and g.device == x.device and g.shape == u.shape):
        return None
    if gp.bias is not None or up.bias is not None or not _is_silu(mlp) or _needs_grad(x, g, u):
        return None
    w = getattr(mlp, _FUSED, None)
    fresh = w is not None and w.device == g.device and w.dtype == g.dtype
    if torch.compiler.is_compiling():
        return w if fresh else None  # fused by an eager call; a compiled graph never re-lays the weights
    if fresh and _views_of(w, g, u):
        return w
    return _fuse_gate_up(mlp)


def _make_mlp_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    def forward(self: Any, x: Any) -> Any:
        w = _gate_up_weight(self, x)
        if w is None:
            return original(self, x)
        return self.down_proj(K.swiglu(F.linear(x, w)))

    setattr(forward, _MARK, original)
    forward.__name__ = "tiletune_mlp_forward"
    return forward


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


_SDPA: list[Callable[..., Any]] = []  # transformers' sdpa_attention_forward, set when the attention is registered


def _attention_covers(module: Any, q: Any, k: Any, v: Any, mask: Any, dropout: float, scaling: Any,
                      kwargs: dict[str, Any]) -> bool:
    if mask is not None or dropout or kwargs.get("output_attentions") or kwargs.get("position_bias") is not None:
        return False
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        return False
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape or not _on_device(q):
        return False
    if q.dtype not in _ATTN_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    d = q.shape[-1]
    if d not in _ATTN_HEAD_DIMS or k.shape[-1] != d or k.shape[0] != q.shape[0] or k.device != q.device:
        return False
    if k.shape[1] < 1 or q.shape[1] % k.shape[1] or q.shape[2] < 1 or k.shape[2] < 1:
        return False
    window = kwargs.get("sliding_window")
    if window is not None and k.shape[2] > window:
        return False
    # finite and positive by comparisons only (False for NaN): traceable also where the scale is a symbolic
    # float (``torch.compile(dynamic=True)``), where ``math.isfinite`` breaks the graph
    if scaling is not None and not 0.0 < scaling < math.inf:
        return False
    return not _needs_grad(q, k, v)


def tiletune_attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                               dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                               **kwargs: Any) -> tuple[Any, None]:
    """``transformers`` attention function: :func:`tiletune.kernels.attention` where it covers the call,
    torch's SDPA (Hugging Face's ``sdpa_attention_forward``) otherwise.

    ``query`` ``(B, H, Sq, D)``, ``key``/``value`` ``(B, Hkv, Sk, D)`` (the cache already updated); returns
    ``(B, Sq, H, D)`` and no weights. The causal rule is SDPA's: causal when ``Sq > 1`` and no mask; the
    mask function (:func:`transformers.masking_utils.sdpa_mask`) leaves the mask out only where that is
    exact (no padding; ``Sq == Sk``, one query, or a prefill into an empty static cache, where the keys
    past ``Sq`` are dropped as SDPA's path does).
    """
    if not _attention_covers(module, query, key, value, attention_mask, dropout, scaling, kwargs):
        return _SDPA[0](module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                               is_causal=is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    sq, sk = query.shape[2], key.shape[2]
    causal = bool(causal) and sq > 1
    if causal and sk > sq:  # prefill into an empty static cache (the only maskless case with Sk > Sq > 1)
        key, value = key[:, :, :sq], value[:, :, :sq]
    out = K.attention(query, key, value, causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> bool:
    """Register the attention function and its mask function; False where ``transformers`` has no mask interface."""
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        from transformers.modeling_utils import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError:
        return False
    from transformers.masking_utils import causal_mask_function

    def tiletune_mask(*args: Any, **kw: Any) -> Any:
        """SDPA's mask function, except that a plain causal mask with no padding is left out (None) where that is
        exact (one query, or as many queries as keys) without reading any tensor, so also while compiling
        (transformers' own check gives up under ``torch.compile`` in some versions)."""
        if (not args and kw.get("attention_mask") is None and kw.get("allow_is_causal_skip", True)
                and kw.get("mask_function", causal_mask_function) is causal_mask_function
                and kw.get("local_size") is None and isinstance(kw.get("kv_length"), int)):
            q_len = kw.get("q_length")
            if q_len is None and kw.get("cache_position") is not None:
                q_len = kw["cache_position"].shape[0]
            if isinstance(q_len, int) and (q_len == 1 or q_len == kw["kv_length"]):
                return None
        return sdpa_mask(*args, **kw)

    _SDPA[:] = [sdpa_attention_forward]
    AttentionInterface.register(ATTN_IMPLEMENTATION, tiletune_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, tiletune_mask)
    return True


def _set_attn_implementation(model: Any, name: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        try:
            setter(name)
            return
        except Exception:  # older versions validate names against a fixed list
            pass
    model.config._attn_implementation = name


# ---------------------------------------------------------------------------------------------
# Patching
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PatchReport:
    """What one ``apply_tiletune*`` call patched.

    ``patched``: part -> what was patched (``"rms_norm"``: modules or the class, ``"rope"``: the module
    function, ``"swiglu"``: MLP modules or the class, ``"attention"``: the implementation name);
    ``skipped``: part -> why not. ``revert()`` undoes this call's patches (latest first).
    """

    model_type: str
    target: str  # "model" (one instance's modules) or "classes" (the modeling module)
    transformers_version: str
    patched: dict[str, str]
    skipped: dict[str, str]
    _undo: list[Callable[[], None]] = dataclasses.field(default_factory=list, repr=False, compare=False)

    def revert(self) -> None:
        """Undo the patches of this call (idempotent)."""
        while self._undo:
            self._undo.pop()()


# modeling module -> [original rope function, number of active patches]
_ROPE: dict[str, list[Any]] = {}


def _patch_rope(modeling: Any) -> Callable[[], None]:
    name = modeling.__name__
    if name not in _ROPE:
        original = modeling.apply_rotary_pos_emb
        original = getattr(original, _MARK, original)
        _ROPE[name] = [original, 0]
        modeling.apply_rotary_pos_emb = _make_rope(original)
    _ROPE[name][1] += 1
    done = [False]

    def undo() -> None:
        if done[0]:
            return
        done[0] = True
        entry = _ROPE[name]
        entry[1] -= 1
        if entry[1] == 0:
            modeling.apply_rotary_pos_emb = entry[0]
            del _ROPE[name]

    return undo


def _patch_class_attr(cls: type, attr: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], None]:
    current = cls.__dict__.get(attr)
    if current is not None and hasattr(current, _MARK):
        return lambda: None  # already patched by an earlier call: that call's revert undoes it
    original = getattr(cls, attr)
    setattr(cls, attr, make(original))

    def undo() -> None:
        if current is None:
            if attr in cls.__dict__:
                delattr(cls, attr)
        else:
            setattr(cls, attr, current)

    return undo


def _patch_instances(modules: list[Any], make: Callable[[Callable[..., Any]], Callable[..., Any]],
                     after_undo: Callable[[Any], None] | None = None) -> Callable[[], None]:
    patched = []
    for m in modules:
        if "forward" in m.__dict__ and hasattr(m.__dict__["forward"], "__func__") and \
                hasattr(m.__dict__["forward"].__func__, _MARK):
            continue  # already patched
        cls_forward = type(m).forward
        original = getattr(cls_forward, _MARK, cls_forward)
        m.forward = types.MethodType(make(original), m)
        patched.append(m)

    def undo() -> None:
        for m in patched:
            m.__dict__.pop("forward", None)
            if after_undo is not None:
                after_undo(m)

    return undo


def _default_to_tiletune_post_init(cls: type) -> Callable[[], None]:
    """Wrap ``cls.post_init`` so models built later with the default ``"sdpa"`` attention get tiletune's."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def post_init(self: Any) -> Any:
            out = original(self)
            if getattr(self.config, "_attn_implementation", None) == "sdpa":
                self.config._attn_implementation = ATTN_IMPLEMENTATION
            return out

        setattr(post_init, _MARK, original)
        return post_init

    return _patch_class_attr(cls, "post_init", make)


_MODELS = {
    "llama": ("transformers.models.llama.modeling_llama", "Llama"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
}
#: ``config.model_type`` values :func:`apply_tiletune` knows.
SUPPORTED_MODEL_TYPES = tuple(_MODELS)


def _apply(model_type: str, model: Any, rms_norm: bool, rope: bool, swiglu: bool, attention: bool) -> PatchReport:
    import transformers

    module_name, prefix = _MODELS[model_type]
    modeling = importlib.import_module(module_name)
    norm_cls = getattr(modeling, f"{prefix}RMSNorm")
    mlp_cls = getattr(modeling, f"{prefix}MLP")
    if model is not None:
        mt = getattr(getattr(model, "config", None), "model_type", None)
        if mt != model_type:
            raise ValueError(f"apply_tiletune_to_{model_type}(): the model's config.model_type is {mt!r}")
    report = PatchReport(model_type, "model" if model is not None else "classes", transformers.__version__, {}, {})
    undo = report._undo
    if rms_norm:
        if model is not None:
            mods = [m for m in model.modules() if isinstance(m, norm_cls)]
            undo.append(_patch_instances(mods, _make_rms_forward))
            report.patched["rms_norm"] = f"{len(mods)} {norm_cls.__name__} modules"
        else:
            undo.append(_patch_class_attr(norm_cls, "forward", _make_rms_forward))
            report.patched["rms_norm"] = f"{norm_cls.__name__}.forward"
    if rope:
        if hasattr(modeling, "apply_rotary_pos_emb"):
            undo.append(_patch_rope(modeling))
            report.patched["rope"] = f"{module_name}.apply_rotary_pos_emb (module-wide)"
        else:
            report.skipped["rope"] = f"{module_name} has no apply_rotary_pos_emb"
    if swiglu:
        if model is not None:
            mods = [m for m in model.modules() if isinstance(m, mlp_cls)]
            undo.append(_patch_instances(mods, _make_mlp_forward, after_undo=_unfuse_gate_up))
            report.patched["swiglu"] = f"{len(mods)} {mlp_cls.__name__} modules"
        else:
            undo.append(_patch_class_attr(mlp_cls, "forward", _make_mlp_forward))
            report.patched["swiglu"] = f"{mlp_cls.__name__}.forward"
    if attention:
        if not _register_attention():
            report.skipped["attention"] = (f"transformers {transformers.__version__} has no attention mask interface "
                                           "(needs >= 4.53)")
        elif model is not None:
            before = getattr(model.config, "_attn_implementation", None)
            _set_attn_implementation(model, ATTN_IMPLEMENTATION)
            undo.append(lambda: _set_attn_implementation(model, before or "sdpa"))
            report.patched["attention"] = f"attn_implementation {ATTN_IMPLEMENTATION!r} (was {before!r})"
        else:
            pre = getattr(modeling, f"{prefix}PreTrainedModel")
            undo.append(_default_to_tiletune_post_init(pre))
            report.patched["attention"] = (f"attn_implementation {ATTN_IMPLEMENTATION!r} registered; the default "
                                           f"for {prefix} models built from now on")
    return report


def apply_tiletune_to_llama(model: Any = None, *, rms_norm: bool = True, rope: bool = True, swiglu: bool = True,
                            attention: bool = True) -> PatchReport:
    """Patch a Llama model (``model``'s modules in place) or, without one, ``modeling_llama`` itself."""
    return _apply("llama", model, rms_norm, rope, swiglu, attention)


def apply_tiletune_to_qwen2(model: Any = None, *, rms_norm: bool = True, rope: bool = True, swiglu: bool = True,
                            attention: bool = True) -> PatchReport:
    """Patch a Qwen2 model (``model``'s modules in place) or, without one, ``modeling_qwen2`` itself."""
    return _apply("qwen2", model, rms_norm, rope, swiglu, attention)


def apply_tiletune(model: Any, **parts: bool) -> PatchReport:
    """Patch ``model`` with the function for its ``config.model_type`` (:data:`SUPPORTED_MODEL_TYPES`)."""
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if mt not in _MODELS:
        raise ValueError(f"apply_tiletune(): model_type {mt!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    return _apply(mt, model, **{"rms_norm": True, "rope": True, "swiglu": True, "attention": True, **parts})
