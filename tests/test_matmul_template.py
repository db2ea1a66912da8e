"""The matmul space template (pure Python, no cuTile needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tiletune.templates import matmul_baseline, matmul_params, matmul_space


@pytest.mark.parametrize("elem_bytes", [1, 2, 4])
def test_matmul_space_keeps_bytes_per_stage_and_its_rules(elem_bytes):
    space = matmul_space(elem_bytes)
    cfgs = space.candidates("sm_90")
    assert len(cfgs) == 38
    assert cfgs[0].as_dict() == matmul_baseline(elem_bytes)
    assert set(space.hint_names) == {"occupancy", "num_worker_warps"}
    assert {c.TK * elem_bytes for c in cfgs} == {64, 128, 256}
    for c in cfgs:
        assert (c.TM + c.TN) * c.TK * elem_bytes <= 49152  # one A + B stage <= 48 KiB
        assert c.TM * c.TN * c.occupancy <= 256 * 128  # accumulators fit the register file
        assert c.num_worker_warps == 4 or (c.TM >= 128 and c.TN >= 128)
        assert c.TM * c.TN < 256 * 128 or c.num_worker_warps == 8
        assert c.TK * elem_bytes < 256 or c.TM + c.TN <= 192


def test_matmul_template_refuses_other_widths():
    with pytest.raises(ValueError, match="elem_bytes must be 1, 2 or 4"):
        matmul_params(3)


def test_matmul_spaces_of_the_library_come_from_the_template():
    gemm = pytest.importorskip("tiletune.kernels.gemm")
    for space, width in ((gemm.GEMM_SPACE, 2), (gemm.GEMM_TF32_SPACE, 4), (gemm.GEMM_FP8_SPACE, 1)):
        assert space.hash == matmul_space(width).hash
    assert matmul_space(2).constraint_names == ("stage_fits", "acc_fits", "warps_fit", "library_shape")


def test_warps_rule_for_the_biggest_accumulators():
    from tiletune.templates import warps_fit

    assert not warps_fit(SimpleNamespace(TM=256, TN=128, num_worker_warps=4))
    assert warps_fit(SimpleNamespace(TM=256, TN=128, num_worker_warps=8))
    assert warps_fit(SimpleNamespace(TM=128, TN=128, num_worker_warps=4))
