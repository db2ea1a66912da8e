"""The matmul space template (pure Python, no cuTile needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tiletune.space.templates import matmul_baseline, matmul_params, matmul_space


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


#: The 38 configs of the library GEMM spaces as (TM, TN, K bytes per stage, occupancy, worker warps), in
#: space order, written out from the hand-made spaces the template replaced (commit 96e9238's parent):
#: an independent expectation, not a second call of the template.
LIBRARY_GEMM_CONFIGS = [
    (128, 256, 128, 1, 8),
    (64, 64, 64, 1, 4), (64, 64, 64, 2, 4), (64, 64, 128, 1, 4), (64, 64, 128, 2, 4), (64, 64, 256, 1, 4),
    (64, 64, 256, 2, 4), (64, 128, 64, 1, 4), (64, 128, 64, 2, 4), (64, 128, 128, 1, 4), (64, 128, 128, 2, 4),
    (64, 128, 256, 1, 4), (64, 128, 256, 2, 4), (64, 256, 64, 1, 4), (64, 256, 64, 2, 4), (64, 256, 128, 1, 4),
    (64, 256, 128, 2, 4), (128, 64, 64, 1, 4), (128, 64, 64, 2, 4), (128, 64, 128, 1, 4), (128, 64, 128, 2, 4),
    (128, 64, 256, 1, 4), (128, 64, 256, 2, 4), (128, 128, 64, 1, 4), (128, 128, 64, 1, 8), (128, 128, 64, 2, 4),
    (128, 128, 64, 2, 8), (128, 128, 128, 1, 4), (128, 128, 128, 1, 8), (128, 128, 128, 2, 4),
    (128, 128, 128, 2, 8), (128, 256, 64, 1, 8), (256, 64, 64, 1, 4), (256, 64, 64, 2, 4), (256, 64, 128, 1, 4),
    (256, 64, 128, 2, 4), (256, 128, 64, 1, 8), (256, 128, 128, 1, 8),
]


@pytest.mark.parametrize("elem_bytes", [1, 2, 4])
def test_matmul_template_yields_the_library_configs(elem_bytes):
    cfgs = matmul_space(elem_bytes).candidates("sm_90")
    assert [(c.TM, c.TN, c.TK * elem_bytes, c.occupancy, c.num_worker_warps) for c in cfgs] == LIBRARY_GEMM_CONFIGS
    assert {(c.GROUP_M, c.LAT) for c in cfgs} == {(8, 0)}


def test_matmul_spaces_of_the_library_come_from_the_template():
    gemm = pytest.importorskip("tiletune.kernels.gemm")
    for space, width in ((gemm.GEMM_SPACE, 2), (gemm.GEMM_TF32_SPACE, 4), (gemm.GEMM_FP8_SPACE, 1)):
        cfgs = space.candidates("sm_90")
        assert [(c.TM, c.TN, c.TK * width, c.occupancy, c.num_worker_warps) for c in cfgs] == LIBRARY_GEMM_CONFIGS
        assert space.constraint_names == ("stage_fits", "acc_fits", "warps_fit", "library_shape")
    # the three widths are distinct spaces (their TK differ), not one space reused
    assert len({gemm.GEMM_SPACE.hash, gemm.GEMM_TF32_SPACE.hash, gemm.GEMM_FP8_SPACE.hash}) == 3


def test_warps_rule_for_the_biggest_accumulators():
    from tiletune.space.templates import warps_fit

    assert not warps_fit(SimpleNamespace(TM=256, TN=128, num_worker_warps=4))
    assert warps_fit(SimpleNamespace(TM=256, TN=128, num_worker_warps=8))
    assert warps_fit(SimpleNamespace(TM=128, TN=128, num_worker_warps=4))
