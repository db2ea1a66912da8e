"""Problem keys of the library ops: named, folded, bucketed (what changes a kernel's choice).

:class:`ProblemKey` is a :class:`~tiletune.buckets.Buckets` whose key is not the bucketed shapes of the
launch arguments but a small named description of the problem the kernel solves, computed from those
arguments by the op: a GEMM's ``M`` (leading dimensions folded, bucketed), ``N``, ``K`` and named
operand layout (``"nt"`` for ``x @ w.t()``); attention's batch x heads, group size and bucketed
lengths; decode attention's bucketed batch and cache length. Strides that the kernel reads the same
way (views of a fused qkv output, a contiguous tensor) do not enter it.

Only the shared (stored, bucket) key changes: a tuned op still keys its in-process launch cache by the
call's exact arguments (shapes and strides, :func:`tiletune.keys.default_key`), so the hot path and the
recorded plans are those of the exact call. Contract, as for any bucket: every config of the op's space
is correct for every problem with the same key (the kernels mask ragged edges and read strides at run
time).

Stored form: ``[{"bucketed": true}, {"problem": "<kind>", name: value, ...}]`` (canonical JSON sorts the
names). :func:`convert_stored_key` rewrites keys stored in the older (per-argument) form.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tiletune.buckets import Buckets, bucket_size

__all__ = ["ProblemKey", "convert_stored_key", "dtype_name", "layout_name", "pow2", "rounded", "KV_LEN_GRID"]

#: Cache lengths of decode attention are bucketed on this coarse grid (the attended length is on the
#: device; the capacity is its host-side bound): 1-1024, 1025-8192, 8193-65536, 65537-524288.
KV_LEN_GRID = (1024, 8192, 65536, 524288)


def pow2(n: int) -> int:
    """``n`` rounded up to a power of two (0 stays 0)."""
    return bucket_size(int(n), "pow2")


def rounded(n: int, rule: Any = "pow2", exact: bool = False) -> int:
    """``n`` in its bucket under ``rule`` (:func:`~tiletune.buckets.bucket_size`), or ``n`` itself when
    ``exact``: the describe functions of :class:`ProblemKey` take ``exact`` for the call's own sizes."""
    return int(n) if exact else bucket_size(int(n), rule)


def dtype_name(dtype: Any) -> str:
    s = str(dtype)
    return s[6:] if s.startswith("torch.") else s


def layout_name(trans_a: bool, trans_b: bool) -> str:
    """BLAS-style name of a product's operand layouts: ``n`` a row-major operand, ``t`` one read transposed
    (``"nt"``: ``x @ w.t()`` with ``w`` an ``nn.Linear`` weight ``[N, K]``)."""
    return ("t" if trans_a else "n") + ("t" if trans_b else "n")


class ProblemKey(Buckets):
    """A bucket key given by a function of the launch arguments.

    Args:
        kind: the problem's name in the stored key (``"gemm"``, ``"attention"``, ...).
        describe: ``describe(args, exact=False) -> {name: int | str | bool}``: the problem of one call, its
            bucketed dimensions already rounded (``args``: the launch plan's arguments, positional, after
            the config); with ``exact=True`` the same names with the call's own sizes (:meth:`exact_key_json`).
        rules: ``{name: rule}`` of the bucketed names, for reports and a nearest-neighbour source (which
            names are sizes worth a distance); not applied here.
        refine: as for :class:`~tiletune.buckets.Buckets`.
    """

    def __init__(self, kind: str, describe: Callable[[Sequence[Any]], Mapping[str, Any]],
                 rules: Mapping[str, Any] | None = None, *, refine: bool = False) -> None:
        self.kind = kind
        self.describe_fn = describe
        self.named_rules = dict(rules or {})
        self.refine = refine
        self.rules = {}
        self._positions = {}

    def resolve(self, params: Sequence[str]) -> "ProblemKey":
        return self  # the function reads the arguments by position

    def problem(self, args: Sequence[Any]) -> dict[str, Any]:
        """The named problem of a call (JSON-able values)."""
        return {"problem": self.kind, **self.describe_fn(args)}

    def key(self, args: Sequence[Any]) -> tuple:
        device = None
        for a in args:
            get = getattr(a, "get_device", None)
            if get is not None and hasattr(a, "shape"):
                device = get()
                break
        return (self.kind, tuple(sorted(self.describe_fn(args).items())), device)

    def key_json(self, args: Sequence[Any]) -> list[Any]:
        return [{"bucketed": True}, self.problem(args)]

    def exact_key_json(self, args: Sequence[Any]) -> list[Any]:
        return [{"bucketed": True}, {"problem": self.kind, **self.describe_fn(args, exact=True)}]

    def describe(self) -> dict[str, Any]:
        return {"problem": self.kind, **{k: (r if isinstance(r, str) else list(r)) for k, r in self.named_rules.items()}}


# ------------------------------------------------------------------------------ stored keys, old -> new


def _shape(d: Any) -> list[int] | None:
    return list(d["shape"]) if isinstance(d, dict) and isinstance(d.get("shape"), list) else None


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _convert_gemm(key: list[Any]) -> list[Any] | None:
    # [{"bucketed"}, a, b, c, scale_a, scale_b, trans_a, trans_b, scaled (, ws, sem)]: M already bucketed
    if not key or key[0] != {"bucketed": True} or len(key) not in (9, 11):
        return None
    a, b, c, _, _, trans_a, trans_b, scaled = key[1:9]
    sa, sb, sc = _shape(a), _shape(b), _shape(c)
    if sa is None or sb is None or sc is None or len(sc) != 3:
        return None
    if not all(isinstance(x, bool) for x in (trans_a, trans_b, scaled)):
        return None
    batch, m, n = sc
    k = sa[1] if trans_a else sa[2]
    return [{"bucketed": True}, {"problem": "gemm", "batch": batch, "M": m, "N": n, "K": k,
                                 "layout": layout_name(trans_a, trans_b), "dtype": a["dtype"],
                                 "out_dtype": c["dtype"], "scaled": scaled}]


def _convert_rope(key: list[Any]) -> list[Any] | None:
    # [{"bucketed"}, q1, q2, k1, k2, c1, c2, s1, s2]: q1 (B, S bucket, Hq, R/2); c1 (Bc, S bucket, R/2)
    if not key or key[0] != {"bucketed": True} or len(key) != 9:
        return None
    q1, k1, c1 = _shape(key[1]), _shape(key[3]), _shape(key[5])
    if q1 is None or k1 is None or c1 is None:
        return None
    b, s = q1[0], q1[1]
    if b != 1 or c1[0] != 1:  # tokens of B x (S/2, S] are no one power-of-two bucket
        return None
    return [{"bucketed": True}, rope_problem_dict(b * s, q1[2], k1[2], q1[3], key[1]["dtype"], key[5]["dtype"], False)]


def rope_problem_dict(tokens: int, hq: int, hk: int, half: int, dtype: str, trig_dtype: str,
                      trig_batched: bool, exact: bool = False) -> dict[str, Any]:
    return {"problem": "rope", "tokens": rounded(tokens, exact=exact), "q_heads": hq, "kv_heads": hk, "rotary": 2 * half,
            "dtype": dtype, "trig_dtype": trig_dtype, "trig_batched": trig_batched}


def attention_problem_dict(b: int, h: int, hkv: int, sq: int, sk: int, d: int, causal: bool,
                           dtype: str, exact: bool = False) -> dict[str, Any]:
    return {"problem": "attention", "batch_heads": rounded(b * h, exact=exact), "group": h // max(1, hkv),
            "q_len": rounded(sq, exact=exact), "kv_len": rounded(sk, exact=exact), "head_dim": d, "causal": bool(causal), "dtype": dtype}


def _convert_attention(key: list[Any]) -> list[Any] | None:
    # exact key: [q, k, v, o, causal, {"type": "float"}]; convertible when the sizes are their buckets' tops
    if not key or len(key) != 6 or not isinstance(key[4], bool):
        return None
    q, k = _shape(key[0]), _shape(key[1])
    if q is None or k is None or len(q) != 4 or len(k) != 4:
        return None
    b, h, sq, d = q
    hkv, sk = k[1], k[2]
    if not (_is_pow2(b * h) and _is_pow2(sq) and _is_pow2(sk)):
        return None
    return [{"bucketed": True}, attention_problem_dict(b, h, hkv, sq, sk, d, key[4], key[0]["dtype"])]


_CONVERTERS: dict[str, Callable[[list[Any]], list[Any] | None]] = {
    "tiletune.gemm": _convert_gemm,
    "tiletune.gemm_tf32": _convert_gemm,
    "tiletune.gemm_fp8": _convert_gemm,
    "tiletune.gemm_splitk": _convert_gemm,
    "tiletune.rope": _convert_rope,
    "tiletune.attention": _convert_attention,
    "tiletune.decode_attention": lambda key: None,
    "tiletune.decode_attention_direct": lambda key: None,
}


def convert_stored_key(name: str, key: Any) -> Any:
    """A stored key of op ``name`` in the current form: unchanged for ops whose key did not change (and for
    keys already converted), the re-keyed form where that is a pure re-keying, None where it is not (the
    entry must be made again)."""
    conv = _CONVERTERS.get(name)
    if conv is None:
        return key
    if isinstance(key, list) and len(key) == 2 and isinstance(key[1], dict) and "problem" in key[1]:
        return key
    return conv(key) if isinstance(key, list) else None
