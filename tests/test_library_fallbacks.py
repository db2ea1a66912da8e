"""The library ops' fallbacks (the op in torch, run while a new key's config compiles in the background)
write what the kernel writes: each is checked on CPU tensors against the op's reference with the op's own
tolerance, the way a candidate config is checked (tiletune.devices.verify)."""

from __future__ import annotations

import inspect
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")  # the op modules import it (the fallbacks themselves are torch)

from tiletune.devices.verify import ArgGuard, Checker  # noqa: E402
from tiletune.kernels import attention_op, decode_attention_op as dec, gemm, gemm_glu, glu, norms, rope, softmax_op  # noqa: E402
from tiletune.kernels.library_op import LibraryOp, reference_fallback  # noqa: E402

bf16 = torch.bfloat16


def _r(*shape, dtype=bf16):
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


def _e(*shape, dtype=bf16):
    return torch.empty(*shape, dtype=dtype)


def _gemm(m, n, k, trans_b=False, split=False):
    a = _r(1, m, k)
    b = _r(1, n, k) if trans_b else _r(1, k, n)
    args = [a, b, _e(1, m, n), torch.ones(1), torch.ones(1), False, trans_b, False]
    if split:
        args += [torch.full((4, 64, n), 7.0), torch.zeros(8, dtype=torch.int32)]
    return tuple(args)


def _attention(b, h, hkv, s, d, causal):
    q, k, v = _r(b, h, s, d), _r(b, hkv, s, d), _r(b, hkv, s, d)
    return (q, k, v, torch.empty_like(q), causal, (1.0 / math.sqrt(d)) * attention_op.LOG2E)


def _rope(b, s, h, hk, r):
    q, k = _r(b, s, h, r), _r(b, s, hk, r)
    ang = torch.rand(b, s, r // 2) * 6.0
    c, sn = ang.cos().to(bf16), ang.sin().to(bf16)
    return (q[..., : r // 2], q[..., r // 2:], k[..., : r // 2], k[..., r // 2:], c, c, sn, sn)


def _decode(direct: bool):
    b, h, hkv, cap, d = 3, 8, 2, 700, 128
    q, k, v = _r(b, h, 1, d), _r(b, hkv, cap, d), _r(b, hkv, cap, d)
    lens = torch.tensor([700, 333, 65], dtype=torch.int32)
    call = dec.prepare_decode(q, k, v, lens, True, 1.0 / math.sqrt(d), sms=1 if direct else 132,
                              allow_direct=direct)
    assert call.direct == direct
    return call.direct_args if direct else call.partial_args


def _append():
    b, hkv, cap, t, d = 2, 2, 50, 3, 64
    cache_k, cache_v = _r(b, hkv, cap, d), _r(b, hkv, cap, d)
    k, v = _r(b, hkv, t, d), _r(b, hkv, t, d)
    return dec.prepare_kv_cache_append(cache_k, cache_v, k, v, torch.tensor([5, 48], dtype=torch.int32)).args


def _combine():
    b, h, hkv, cap, d = 2, 8, 2, 640, 64
    q, k, v = _r(b, h, 1, d), _r(b, hkv, cap, d), _r(b, hkv, cap, d)
    call = dec.prepare_decode(q, k, v, torch.tensor([640, 200], dtype=torch.int32), True, 1.0 / math.sqrt(d),
                              sms=132, allow_direct=False)
    po, pl, o = call.combine_args
    po.copy_(torch.randn(po.shape))
    pl.copy_(torch.randn(pl.shape))
    return call.combine_args


CASES = {
    "kv_cache_append": (dec.KV_APPEND, _append),
    "decode_combine": (dec.DECODE_COMBINE, _combine),
    "decode_partial": (dec.DECODE_PARTIAL, lambda: _decode(False)),
    "decode_direct": (dec.DECODE_DIRECT, lambda: _decode(True)),
    "gemm": (gemm.GEMM, lambda: _gemm(37, 96, 200)),
    "gemm_nt": (gemm.GEMM, lambda: _gemm(5, 64, 300, trans_b=True)),
    "gemm_splitk": (gemm.GEMM_SPLITK, lambda: _gemm(16, 64, 512, trans_b=True, split=True)),
    "gemm_swiglu": (gemm_glu.GEMM_SWIGLU, lambda: (_r(24, 128), _r(96, 128), _r(96, 128), _e(24, 96), True)),
    "attention_causal_gqa": (attention_op.ATTENTION, lambda: _attention(2, 8, 2, 40, 64, True)),
    "attention": (attention_op.ATTENTION, lambda: _attention(1, 4, 4, 33, 128, False)),
    "rms_norm": (norms.RMS_NORM, lambda: (_r(17, 256), _r(256), _e(17, 256), 1e-6, True)),
    "rms_norm_residual": (norms.RMS_NORM_RESIDUAL,
                          lambda: (_r(9, 320), _r(9, 320), _r(320), _e(9, 320), _e(9, 320), 1e-5, True)),
    "layer_norm": (norms.LAYER_NORM, lambda: (_r(11, 192), _r(192), _r(192), _e(11, 192), 1e-5, True, True)),
    "softmax": (softmax_op.SOFTMAX, lambda: (_r(13, 1000), _e(13, 1000))),
    "swiglu": (glu.SWIGLU, lambda: (_r(7, 300), _r(7, 300), _e(7, 300), glu.ACT_SILU)),
    "rope": (rope.ROPE, lambda: _rope(2, 5, 8, 2, 64)),
}


def _positions(lib: LibraryOp) -> tuple[list[int], list[int]]:
    params = list(inspect.signature(lib.plan).parameters)[1:]
    return [params.index(n) for n in lib.writes], [params.index(n) for n in lib.inplace]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_fallback_writes_what_the_reference_expects(case):
    torch.manual_seed(0)
    lib, make = CASES[case]
    assert lib.fallback is not None
    args = make()
    writes, inplace = _positions(lib)
    guard = ArgGuard(args, writes, inplace)
    tol = lib.tolerance(*args) if callable(lib.tolerance) else lib.tolerance
    checker = Checker(lib.reference, guard, tol)  # the expected values, from the untouched arguments
    guard.prepare_checked_run()  # outputs poisoned: the fallback must write every element
    lib.fallback(*args)
    assert checker.compare() is None


def test_a_wrong_fallback_fails_the_same_check():
    """The check above can fail: a fallback that forgets the weight does not pass."""
    args = (_r(17, 256), _r(256) + 3.0, _e(17, 256), 1e-6, True)
    guard = ArgGuard(args, [2], [])
    checker = Checker(norms.RMS_NORM.reference, guard, norms.RMS_NORM.tolerance(*args))
    guard.prepare_checked_run()
    args[2].copy_(norms.rms_norm_reference(args[0], args[1], args[2], 1e-6, False))
    assert checker.compare() is not None


def test_reference_fallback_skips_scratch_and_values_written_in_place():
    from tiletune.devices.verify import SCRATCH

    def plan(cfg, x, out, scratch, acc):
        return None

    def reference(x, out, scratch, acc):
        acc.add_(1)  # written in place by the reference itself
        return x * 2, SCRATCH, acc

    fb = reference_fallback(plan, reference, ["out"], ["scratch", "acc"])
    x, out, scratch, acc = torch.ones(3), torch.zeros(3), torch.full((3,), 5.0), torch.zeros(3)
    fb(x, out, scratch, acc)
    assert out.tolist() == [2.0] * 3 and scratch.tolist() == [5.0] * 3 and acc.tolist() == [1.0] * 3
    with pytest.raises(ValueError, match="not parameters of the plan"):
        reference_fallback(plan, reference, ["y"])


def test_library_op_fallback_settings_are_checked():
    with pytest.raises(ValueError, match="needs a reference"):
        LibraryOp("t.x", lambda r: None, lambda cfg, x: None, fallback="reference")
    with pytest.raises(TypeError, match="fallback must be a callable"):
        LibraryOp("t.y", lambda r: None, lambda cfg, x: None, fallback=3)
    LibraryOp._instances[:] = [i for i in LibraryOp._instances if i.name not in ("t.x", "t.y")]


def test_the_decode_split_path_run_by_fallbacks_is_attention_over_the_cache():
    """The partial op's fallback writes the partials the combine kernel reads: combined (by the combine
    op's reference, what its kernel computes), they are attention over each entry's visible positions."""
    torch.manual_seed(1)
    b, h, hkv, cap, d = 2, 8, 2, 640, 64
    q, k, v = _r(b, h, 1, d), _r(b, hkv, cap, d), _r(b, hkv, cap, d)
    lens = torch.tensor([640, 200], dtype=torch.int32)
    call = dec.prepare_decode(q, k, v, lens, True, 1.0 / math.sqrt(d), sms=132, allow_direct=False)
    assert not call.direct and call.splits > 1
    dec.DECODE_PARTIAL.fallback(*call.partial_args)
    po, pl, o = call.combine_args
    o.copy_(dec.decode_combine_reference(po, pl, o))
    for i, n in enumerate(lens.tolist()):
        kk = k[i:i + 1, :, :n].repeat_interleave(h // hkv, dim=1).float()
        vv = v[i:i + 1, :, :n].repeat_interleave(h // hkv, dim=1).float()
        want = torch.softmax(q[i:i + 1].float() @ kk.transpose(-1, -2) / math.sqrt(d), dim=-1) @ vv
        assert torch.allclose(o[i:i + 1].float(), want, atol=2e-2, rtol=2e-2)
