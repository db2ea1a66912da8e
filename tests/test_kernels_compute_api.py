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

gemm_mod = importlib.import_module("tiletune.kernels.gemm")
gemm, matmul = gemm_mod.gemm, gemm_mod.matmul
attention = importlib.import_module("tiletune.kernels.attention_op").attention
FP8 = getattr(torch, "float8_e4m3fn", None)


def _m(*shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


# --------------------------------------------------------------------------------------------- gemm


def test_public_matmul_and_attention_are_the_library_ops():
    import tiletune.kernels as K

    assert K.matmul is matmul
    # "attention" is a submodule too; after importing it, the package attribute still calls the op
    assert callable(K.attention)
    with pytest.raises(TypeError, match="q must be a torch tensor"):
        K.attention(None, None, None)


@pytest.mark.parametrize("sa,sb", [((8, 16), (16, 4)), ((16,), (16, 4)), ((8, 16), (16,)), ((3, 8, 16), (16, 4)),
                                   ((2, 3, 8, 16), (3, 16, 4)), ((1, 8, 16), (4, 1, 16, 4))])
def test_matmul_valid_shapes_reach_the_device_check(sa, sb):
    with pytest.raises(ValueError, match="CUDA device"):
        matmul(_m(*sa), _m(*sb))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gemm_cpu_error_for_every_supported_dtype(dtype):
    with pytest.raises(ValueError, match="CUDA device"):
        gemm(_m(8, 16, dtype=dtype), _m(16, 4, dtype=dtype))


@pytest.mark.skipif(FP8 is None, reason="this torch has no float8_e4m3fn")
def test_matmul_fp8_needs_scales_and_a_sensible_out_dtype():
    a, b = _m(8, 16, dtype=FP8), _m(16, 4, dtype=FP8)
    with pytest.raises(ValueError, match="need scale_a and scale_b"):
        matmul(a, b)
    with pytest.raises(TypeError, match="out_dtype of an fp8 product"):
        matmul(a, b, scale_a=1.0, scale_b=1.0, out_dtype=torch.int32)
    with pytest.raises(ValueError, match="CUDA device"):
        matmul(a, b, scale_a=1.0, scale_b=torch.ones(1))


def test_matmul_scales_only_for_fp8_and_out_dtype_only_the_input_dtype():
    with pytest.raises(ValueError, match="float8_e4m3fn inputs only"):
        matmul(_m(8, 16), _m(16, 4), scale_a=2.0, scale_b=1.0)
    with pytest.raises(TypeError, match="out_dtype must be the inputs' dtype"):
        matmul(_m(8, 16), _m(16, 4), out_dtype=torch.float32)


def test_gemm_rejects_cpu_transposed_views():
    with pytest.raises(ValueError, match="CUDA device"):
        gemm(_m(16, 8).t(), _m(4, 16).t())


def test_gemm_dtype_mismatch():
    with pytest.raises(TypeError, match="one dtype"):
        gemm(_m(8, 16), _m(16, 4, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.int32, torch.bool])
def test_gemm_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match="supports bfloat16, float16, float32 and float8_e4m3fn"):
        gemm(_m(8, 16, dtype=dtype), _m(16, 4, dtype=dtype))


@pytest.mark.parametrize("sa,sb", [((16,), (16, 4)), ((8, 16), (16,)), ((2, 8, 16), (2, 16, 4))])
def test_gemm_alias_is_2d_only(sa, sb):
    with pytest.raises(ValueError, match="2-D"):
        gemm(_m(*sa), _m(*sb))


def test_matmul_rank_zero():
    with pytest.raises(ValueError, match="at least one dimension"):
        matmul(_m(), _m(3))


@pytest.mark.parametrize("sa,sb", [((8, 16), (15, 4)), ((16,), (15,)), ((2, 8, 16), (2, 15, 4))])
def test_matmul_inner_dimensions(sa, sb):
    with pytest.raises(ValueError, match="inner dimensions differ"):
        matmul(_m(*sa), _m(*sb))


@pytest.mark.parametrize("x,y", [((), ()), ((3,), ()), ((), (2, 1)), ((1,), (4,)), ((4,), (1,)), ((2, 1, 3), (5, 1)),
                                 ((0,), (1,)), ((1,), (0,)), ((0, 3), (3,)), ((7, 1, 1), (1, 6, 1)),
                                 ((2,), (3,)), ((0,), (2,)), ((2, 3), (3, 2)), ((4, 1), (5, 3, 2))])
def test_broadcast_batch_follows_torch(x, y):
    try:
        want = tuple(torch.broadcast_shapes(x, y))
    except RuntimeError:
        want = None
    assert gemm_mod.broadcast_batch(x, y) == want


def test_matmul_batch_dims_must_broadcast():
    with pytest.raises(ValueError, match="do not broadcast"):
        matmul(_m(2, 8, 16), _m(3, 16, 4))


def test_gemm_not_tensors():
    with pytest.raises(TypeError, match="torch tensors"):
        gemm([[1.0]], _m(1, 1))
    with pytest.raises(TypeError, match="torch tensors"):
        gemm(_m(1, 1), None)


def test_kernel_operand_layouts():
    """Row-major batches are used as they are, transposed views are read transposed, the rest copied."""
    x = _m(2, 8, 16)
    got, trans = gemm_mod._as_kernel_operand(x)
    assert got is x and not trans
    w = _m(2, 16, 8).transpose(1, 2)  # (2, 8, 16) view of a contiguous (2, 16, 8)
    got, trans = gemm_mod._as_kernel_operand(w)
    assert trans and got.is_contiguous() and tuple(got.shape) == (2, 16, 8)
    odd = _m(2, 8, 7)  # rows of 14 bytes: not 16-byte aligned either way round
    got, trans = gemm_mod._as_kernel_operand(odd[:, :, :6].transpose(1, 2)[:, :5])
    assert not trans and got.is_contiguous()
    got, trans = gemm_mod._as_kernel_operand(_m(1, 1, 8))
    assert not trans


def test_tf32_tolerance_grows_with_k_and_the_data():
    ones = lambda *s: torch.ones(s)  # noqa: E731
    small = gemm_mod._tf32_tolerance(ones(1, 8, 64), ones(1, 64, 8), ones(1, 8, 8), None, None, False)
    big = gemm_mod._tf32_tolerance(ones(1, 8, 4096), ones(1, 4096, 8), ones(1, 8, 8), None, None, False)
    trans = gemm_mod._tf32_tolerance(ones(1, 4096, 8), ones(1, 4096, 8), ones(1, 8, 8), None, None, True)
    assert big["float32"][1] == pytest.approx(8 * small["float32"][1])
    assert trans == big
    scaled = gemm_mod._tf32_tolerance(3 * ones(1, 8, 64), ones(1, 64, 8), ones(1, 8, 8), None, None, False)
    assert scaled["float32"][1] == pytest.approx(3 * small["float32"][1])


def test_library_spaces_are_small_and_keep_their_baselines():
    for space in (gemm_mod.GEMM_SPACE, gemm_mod.GEMM_TF32_SPACE, gemm_mod.GEMM_FP8_SPACE):
        assert 16 <= space.size() <= 48
        assert space.baseline() is not None
    assert gemm_mod.GEMM_FULL_SPACE.size() == 512
    att = importlib.import_module("tiletune.kernels.attention_op")
    assert att.ATTENTION_SPACE.size() == 17 and att.ATTENTION_FULL_SPACE.size() == 330
    assert att.ATTENTION_SPACE.baseline() is not None


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


def test_fp8_tolerance_scales_with_the_per_tensor_scales():
    ones = lambda *s: torch.ones(s)  # noqa: E731
    args = (ones(1, 8, 64), ones(1, 64, 8), ones(1, 8, 8))
    unit = gemm_mod._fp8_tolerance(*args, torch.tensor(1.0), torch.tensor([1.0]), False)
    half = gemm_mod._fp8_tolerance(*args, torch.tensor(0.5), torch.tensor([0.25]), False)
    assert unit["float32"] == gemm_mod._tf32_tolerance(*args, None, None, False)["float32"]
    assert half["float32"][1] == pytest.approx(unit["float32"][1] / 8)
    assert half["float32"].agg_atol == pytest.approx(unit["float32"].agg_atol / 8)
    # bf16 / fp16 results: their own rounding (as the bf16 GEMM) plus the accumulator's absolute terms
    assert set(half) == {"float32", "float16", "bfloat16"}
    own = gemm_mod._tolerance(*args, None, None, False)
    for d in ("float16", "bfloat16"):
        assert half[d].rtol == own[d].rtol and half[d].atol_rms == own[d].atol_rms
        assert half[d].atol == half["float32"].atol and half[d].agg_atol == half["float32"].agg_atol
