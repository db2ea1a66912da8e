"""Input validation of ``gemm`` and ``attention`` that happens before any CUDA call (runs on a CPU).

Both public functions check types, ranks, shapes, dtypes and devices before they allocate or launch
anything, so CPU tensors get a clear error here, on a machine without a GPU. The checks that need
CUDA tensors to be reached (unsupported head dim, head-count ratio, scale, ...) are in
``tests/test_gpu_kernels_compute.py``.
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

gemm = importlib.import_module("tiletune.kernels.gemm").gemm
attention = importlib.import_module("tiletune.kernels.attention").attention


def _m(*shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


# --------------------------------------------------------------------------------------------- gemm


def test_gemm_rejects_cpu_tensors():
    with pytest.raises(ValueError, match="CUDA device"):
        gemm(_m(8, 16), _m(16, 4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gemm_cpu_error_for_every_supported_dtype(dtype):
    with pytest.raises(ValueError, match="CUDA device"):
        gemm(_m(8, 16, dtype=dtype), _m(16, 4, dtype=dtype))


def test_gemm_rejects_cpu_transposed_views():
    with pytest.raises(ValueError, match="CUDA device"):
        gemm(_m(16, 8).t(), _m(4, 16).t())


def test_gemm_dtype_mismatch():
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        gemm(_m(8, 16), _m(16, 4, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.int32, torch.bool])
def test_gemm_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        gemm(_m(8, 16, dtype=dtype), _m(16, 4, dtype=dtype))


@pytest.mark.parametrize("sa,sb", [((16,), (16, 4)), ((8, 16), (16,)), ((2, 8, 16), (2, 16, 4)), ((), ())])
def test_gemm_rank(sa, sb):
    with pytest.raises(ValueError, match="2-D"):
        gemm(_m(*sa), _m(*sb))


def test_gemm_inner_dimensions():
    with pytest.raises(ValueError, match="inner dimensions differ"):
        gemm(_m(8, 16), _m(15, 4))


def test_gemm_not_tensors():
    with pytest.raises(TypeError, match="torch tensors"):
        gemm([[1.0]], _m(1, 1))
    with pytest.raises(TypeError, match="torch tensors"):
        gemm(_m(1, 1), None)


# ---------------------------------------------------------------------------------------- attention


def _qkv(b=1, h=4, hkv=2, s=16, d=64, dtype=torch.bfloat16):
    return _m(b, h, s, d, dtype=dtype), _m(b, hkv, s, d, dtype=dtype), _m(b, hkv, s, d, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_rejects_cpu_tensors(dtype, causal):
    q, k, v = _qkv(dtype=dtype)
    with pytest.raises(ValueError, match="CUDA device"):
        attention(q, k, v, causal=causal)


def test_attention_dtype_mismatch():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="share a dtype"):
        attention(q, k.half(), v)
    with pytest.raises(TypeError, match="share a dtype"):
        attention(q, k, v.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8])
def test_attention_unsupported_dtype(dtype):
    q, k, v = _qkv(dtype=dtype)
    with pytest.raises(TypeError, match="bfloat16 and float16"):
        attention(q, k, v)


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("shape", [(4, 16, 64), (1, 1, 4, 16, 64), (64,)])
def test_attention_rank(which, shape):
    qkv = list(_qkv())
    qkv[which] = _m(*shape)
    with pytest.raises(ValueError, match="4-D"):
        attention(*qkv)


def test_attention_not_tensors():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="v must be a torch tensor"):
        attention(q, k, v.tolist())
    with pytest.raises(TypeError, match="q must be a torch tensor"):
        attention(None, k, v)
