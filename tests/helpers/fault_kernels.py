"""Real cuTile kernels with one deliberately faulty config per fault kind (GPU tests and the
fault-matrix benchmark).

``fault_op`` computes ``y = 2 * x`` over a float32 vector; the ``MODE`` constant plants a fault:

=====  ==================  ===============================================================
MODE   fault               how
=====  ==================  ===============================================================
0      none                gather, scale, scatter (the good configs: TILE 256/512/1024)
1      oob_gather          ``ct.gather`` 2e9 elements past the end, bounds checks off
2      oob_scatter         ``ct.scatter`` likewise
3      misaligned          a gather whose start is claimed 16-divisible but is odd
4      endless_loop        two nested runtime loops of 2^30 iterations
5      trap                ``ct.assert_`` on a condition that never holds
6      wrong_result        ``y = 2x + 1``
7      nan_output          ``y = 2x + 0/0``
8      plan_exception      the launch plan raises for this config
9      compile_error       a tile of 96 elements (not a power of two)
=====  ==================  ===============================================================
"""

from __future__ import annotations

import cuda.tile as ct

import tiletune as tt

FAULTS = {
    1: "oob_gather",
    2: "oob_scatter",
    3: "misaligned",
    4: "endless_loop",
    5: "trap",
    6: "wrong_result",
    7: "nan_output",
    8: "plan_exception",
    9: "compile_error",
}
FAR = 2_000_000_000


@ct.kernel
def fault_kernel(X, Y, n_iter, MODE: ct.Constant[int], TILE: ct.Constant[int]):
    bid = ct.bid(0)
    offs = bid * TILE + ct.arange(TILE, dtype=ct.int32)
    if MODE == 1:
        x = ct.gather(X, offs + FAR, check_bounds=False)
    elif MODE == 3:
        start = ct.assume_divisible_by(bid * TILE + 1, 16)
        x = ct.gather(X, start + ct.arange(TILE, dtype=ct.int32), check_bounds=False)
    else:
        x = ct.gather(X, offs)
    y = x * 2.0
    if MODE == 4:
        acc = x
        for i in range(n_iter):
            for j in range(n_iter):
                acc = acc * 0.5 + x
        y = acc
    if MODE == 5:
        ct.assert_(x > 1.0e30, "planted trap")
    if MODE == 6:
        y = y + 1.0
    if MODE == 7:
        y = y + (x - x) / (x - x)
    if MODE == 2:
        ct.scatter(Y, offs + FAR, y, check_bounds=False)
    else:
        ct.scatter(Y, offs, y)


def space_for(modes: tuple[int, ...] = tuple(FAULTS)) -> tt.Space:
    """Three good configs (MODE 0, TILE 256/512/1024) plus one config per planted fault (TILE 512)."""
    return tt.Space(
        MODE=[0, *modes],
        TILE=[256, 512, 1024, 96] if 9 in modes else [256, 512, 1024],
        constraints={"faults_at_512": lambda c: (c.MODE == 0 and c.TILE != 96) or
                     (c.MODE == 9 and c.TILE == 96) or (c.MODE not in (0, 9) and c.TILE == 512)},
        baseline=dict(MODE=0, TILE=512),
    )


def fault_plan(cfg, x, y):
    if cfg.MODE == 8:
        raise RuntimeError("planted exception in the launch plan")
    n = x.shape[0]
    n_iter = (1 << 30) if cfg.MODE == 4 else 1
    return tt.Launch(fault_kernel, ((n + cfg.TILE - 1) // cfg.TILE,), (x, y, n_iter, cfg.MODE, cfg.TILE))


def make_fault_op(modes: tuple[int, ...] = tuple(FAULTS), db=False, name: str = "fault_op"):
    """A tuned op over :func:`space_for` (reference ``2 * x``, output ``y``)."""
    return tt.autotune(space_for(modes), reference=lambda x, y: x * 2, writes=["y"], db=db, name=name,
                       progress=False)(fault_plan)


fault_op = make_fault_op(db=False)


# -- the fault space (issue 41, item 4) -------------------------------------------------------------
#
# ONE kernel, ``fault_space_kernel``, over a 28-config space: ``T`` (tile) x ``occupancy`` x ``MODE``.
# ``y = 2 * x`` over a float32 vector whose length is not a multiple of any ``T`` (so the last tile is
# partial); ``MODE`` plants the fault:
#
# =====  ================  ==================================================================
# MODE   fault             how
# =====  ================  ==================================================================
# 0      good              gather, scale, scatter (bounds-checked)
# 1      illegal_read      ``ct.gather`` 2e9 elements past the end, bounds checks off
# 2      endless_loop      two nested runtime loops of 2^30 iterations
# 3      tail_wrong        ``y = 2x + 1`` on the last partial tile only (elements >= n_full)
# 4      write_past_end    the store's bounds check off: the last tile writes up to T - 1 elements
#                          (zeros, from the padded load) past the end of ``y``
# =====  ================  ==================================================================
#
# Good configs: T in 64..2048 x occupancy 1/2 (12); each fault at occupancy 1, T in 128..1024 (4 each).

SPACE_FAULTS = {0: "good", 1: "illegal_read", 2: "endless_loop", 3: "tail_wrong", 4: "write_past_end"}
SPACE_T = [64, 128, 256, 512, 1024, 2048]
SPACE_FAULT_T = (128, 1024)  # the T range (inclusive) of the faulty configs


@ct.kernel
def fault_space_kernel(X, Y, n_full, n_iter, MODE: ct.Constant[int], T: ct.Constant[int]):
    bid = ct.bid(0)
    offs = bid * T + ct.arange(T, dtype=ct.int32)
    if MODE == 1:
        x = ct.gather(X, offs + FAR, check_bounds=False)
    else:
        x = ct.gather(X, offs)
    y = x * 2.0
    if MODE == 2:
        acc = x
        for i in range(n_iter):
            for j in range(n_iter):
                acc = acc * 0.5 + x
        y = acc
    if MODE == 3:
        y = ct.where(offs >= n_full, y + 1.0, y)
    if MODE == 4:
        ct.scatter(Y, offs, y, check_bounds=False)
    else:
        ct.scatter(Y, offs, y)


def _fault_space_rule(c) -> bool:
    return c.MODE == 0 or (c.occupancy == 1 and SPACE_FAULT_T[0] <= c.T <= SPACE_FAULT_T[1])


def fault_space() -> tt.Space:
    """The 28-config fault space: 12 good configs, 4 of each fault (see the table above)."""
    return tt.Space(T=SPACE_T, occupancy=[1, 2], MODE=list(SPACE_FAULTS),
                    constraints={"faults_at_occupancy_1": _fault_space_rule},
                    baseline=dict(T=512, occupancy=1, MODE=0))


def fault_space_plan(cfg, x, y):
    n = x.shape[0]
    n_full = (n // cfg.T) * cfg.T  # elements before the last, partial tile
    n_iter = (1 << 30) if cfg.MODE == 2 else 1
    return tt.Launch(fault_space_kernel, ((n + cfg.T - 1) // cfg.T,), (x, y, n_full, n_iter, cfg.MODE, cfg.T))


def make_fault_space_op(db=False, name: str = "fault_space"):
    """A tuned op over :func:`fault_space` (reference ``2 * x``, output ``y``)."""
    return tt.autotune(fault_space(), reference=lambda x, y: x * 2, writes=["y"], db=db, name=name,
                       progress=False)(fault_space_plan)
