"""``tiletune suggest module:kernel``: classify a cuTile kernel from its source and print a template's Space.

The kernel's source (``inspect.getsource`` of the function under ``@ct.kernel``, plus the module-level
helper functions it calls, followed through the same module) is parsed with :mod:`ast`, never run:

* a matrix product (``ct.mma``, ``ct.matmul`` or the ``@`` operator) makes it **compute-bound**:
  ``fmha`` when it also keeps an online softmax (an exponential and a max reduction), ``dual_gemm``
  with two products and an activation (a GLU MLP), ``grouped_gemm`` when its names speak of groups
  or experts, else ``matmul``;
* a reduction over an axis (``ct.sum``, ``ct.max``, ``ct.min``, ... with an axis) makes it
  **balanced**: ``cross_entropy`` when it also takes a logarithm and reads targets (a gather, or
  names like ``target`` / ``label`` / ``ignore_index``), else ``rowwise``;
* anything else is **memory-bound**: ``rope`` when its names speak of rotary embeddings
  (``cos`` / ``sin`` / ``rope`` / ``rotary``), else ``elementwise``.

The template's arguments (row length, element size, ...) cannot be read from the source: the
printed code uses the catalogue's example values unless given (``--set n_cols=8192``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any, Mapping

from tiletune.lab.catalogue import ARCHS, MEASURED_ARCHS, template
from tiletune.lab.catalogue import template as _template

__all__ = ["Suggestion", "classify", "kernel_source", "load_kernel", "render", "suggest"]

_MATMUL_CALLS = {"mma", "matmul", "dot"}
_REDUCTIONS = {"sum", "max", "min", "prod", "argmax", "argmin", "reduce", "mean"}
_EXP = {"exp", "exp2"}
_ACTIVATIONS = {"exp", "exp2", "tanh", "sigmoid", "erf", "silu", "gelu", "relu", "maximum"}
#: names of grouped GEMMs (MoE): not the ``GROUP_SIZE_M`` / ``GROUP_M`` of a swizzled tile order
_GROUP_NAMES = re.compile(r"expert|num_groups|group_?(sizes|offsets|ptrs?|starts|ends|counts|lens)$|problem_sizes"
                          r"|ragged|^(m|tokens)_(sizes|offsets|per_group)$", re.IGNORECASE)
_TARGET_NAMES = re.compile(r"target|label|ignore_index", re.IGNORECASE)
_ROPE_NAMES = re.compile(r"^(cos|sin)|rope|rotary|(^|_)(cos|sin)(_|\d|$)", re.IGNORECASE)


@dataclass(frozen=True)
class Suggestion:
    """What :func:`classify` found: the kind, the template, and why."""

    kind: str
    template: str
    reasons: tuple[str, ...]
    calls: Mapping[str, int] = field(default_factory=dict)


def load_kernel(spec: str) -> Any:
    """The object named by ``"package.module:name"`` (``name`` may be dotted); ValueError otherwise."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(f"expected MODULE:KERNEL (e.g. mypkg.kernels:rms_norm_kernel), got {spec!r}")
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise ValueError(f"expected MODULE:KERNEL (e.g. mypkg.kernels:rms_norm_kernel), got {spec!r}")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {mod_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {mod_name!r} has no attribute {attr!r}") from None
    return obj


def _function(obj: Any) -> Any:
    fn = getattr(obj, "_pyfunc", obj)  # a cuda.tile kernel object keeps its Python function there
    fn = inspect.unwrap(fn)
    if not inspect.isfunction(fn):
        raise ValueError(f"{obj!r} is not a cuTile kernel or a Python function")
    return fn


def kernel_source(obj: Any, follow: bool = True) -> str:
    """The source of a kernel (a ``@ct.kernel`` object or a plain function) and, with ``follow``, of the
    module-level functions of the same module that it calls (transitively)."""
    fn = _function(obj)
    seen: dict[str, str] = {}
    todo = [fn]
    while todo:
        f = todo.pop()
        key = f"{f.__module__}.{f.__qualname__}"
        if key in seen:
            continue
        try:
            src = textwrap.dedent(inspect.getsource(f))
        except (OSError, TypeError):
            if f is fn:
                raise ValueError(f"no source for {fn.__qualname__} (defined interactively or compiled)") from None
            continue
        seen[key] = src
        if not follow:
            break
        globs = getattr(f, "__globals__", {})
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                target = globs.get(node.func.id)
                target = getattr(target, "_pyfunc", target)
                if inspect.isfunction(target) and target.__module__ == fn.__module__:
                    todo.append(target)
    return "\n\n".join(seen.values())


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return None


def _has_axis(node: ast.Call) -> bool:
    return len(node.args) >= 2 or any(k.arg in ("axis", "dim", "axes") for k in node.keywords)


def classify(source: str) -> Suggestion:
    """Classify kernel source text (see the module docstring); ValueError if it does not parse."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError as exc:
        raise ValueError(f"kernel source does not parse: {exc}") from None
    calls: dict[str, int] = {}
    reductions: list[str] = []
    names: set[str] = set()
    matmul_ops = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name:
                calls[name] = calls.get(name, 0) + 1
                if name in _REDUCTIONS and _has_axis(node):
                    reductions.append(name)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            matmul_ops += 1
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
    products = sum(calls.get(n, 0) for n in _MATMUL_CALLS) + matmul_ops
    found = lambda group: sorted(n for n in group if calls.get(n))  # noqa: E731
    if products:
        why = [f"{products} matrix product(s) ({', '.join(found(_MATMUL_CALLS) + (['@'] if matmul_ops else []))})"]
        if found(_EXP) and "max" in reductions:
            return Suggestion("compute-bound", "fmha", (*why, f"online softmax: {', '.join(found(_EXP))} and a "
                                                              "max reduction"), calls)
        groups = sorted(n for n in names if _GROUP_NAMES.search(n))
        if groups:
            return Suggestion("compute-bound", "grouped_gemm", (*why, f"group names: {', '.join(groups[:4])}"), calls)
        if products >= 2 and found(_ACTIVATIONS):
            return Suggestion("compute-bound", "dual_gemm", (*why, f"an activation: {', '.join(found(_ACTIVATIONS))}"),
                              calls)
        return Suggestion("compute-bound", "matmul", tuple(why), calls)
    if reductions:
        why = [f"reduction(s) over an axis: {', '.join(sorted(set(reductions)))}"]
        targets = sorted(n for n in names if _TARGET_NAMES.search(n))
        if calls.get("log") and (calls.get("gather") or targets):
            return Suggestion("balanced", "cross_entropy",
                              (*why, "a log and targets (" + ", ".join((["gather"] if calls.get("gather") else [])
                                                                       + targets[:3]) + ")"), calls)
        return Suggestion("balanced", "rowwise", tuple(why), calls)
    rope = sorted(n for n in names if _ROPE_NAMES.search(n))
    if rope:
        return Suggestion("memory-bound", "rope", ("no matrix product, no reduction",
                                                   f"rotary names: {', '.join(rope[:4])}"), calls)
    return Suggestion("memory-bound", "elementwise", ("no matrix product, no reduction over an axis",), calls)


def render(s: Suggestion, spec: str = "", args: Mapping[str, Any] | None = None) -> str:
    """The suggestion as Python code: comments saying why, then the template's space."""
    t = template(s.template)
    kwargs = {**t.example, **(args or {})}
    recipe = t.recipe(**kwargs)
    others = [a for a in ARCHS if a not in MEASURED_ARCHS]
    head = [f"# tiletune suggest{' ' + spec if spec else ''}",
            f"# kind: {s.kind} ({'; '.join(s.reasons)})",
            f"# template: tiletune.lab.catalogue.template({s.template!r}).space({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
            " -- see docs/TEMPLATES.md",
            f"# {', '.join(MEASURED_ARCHS)} values: {t.evidence}",
            f"# {', '.join(others)} values: unmeasured starting points; tune, then shrink with your measurements"]
    if t.arguments():
        head.append(f"# arguments: {', '.join(f'{k}={v!r}' for k, v in t.arguments().items())}"
                    " (not readable from the source: give them with --set NAME=VALUE)")
    return "\n".join(head) + "\n" + recipe.code()


def suggest(kernel: Any, args: Mapping[str, Any] | None = None, spec: str = "", template: str | None = None) -> str:
    """Classify ``kernel`` (an object, or a ``"module:name"`` string) and return the code of its space;
    ``template`` names a catalogue template to print instead of the classified one."""
    if isinstance(kernel, str):
        spec = spec or kernel
        kernel = load_kernel(kernel)
    s = classify(kernel_source(kernel))
    if template is not None and template != s.template:
        chosen = _template(template)
        s = Suggestion(chosen.kind, chosen.name, (f"--template {chosen.name} (the source suggests {s.template})",),
                       s.calls)
    return render(s, spec, args)


def parse_setting(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with an int, float, ``true``/``false`` or a string value."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise ValueError(f"--set {text!r}: expected NAME=VALUE, e.g. n_cols=8192")
    raw = raw.strip()
    low = raw.lower()
    if low in ("true", "false"):
        return name, low == "true"
    for conv in (int, float):
        try:
            return name, conv(raw)
        except ValueError:
            pass
    return name, raw.strip("'\"")

