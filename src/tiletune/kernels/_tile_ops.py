"""Tile-code helpers shared by the kernel modules (inlined into kernels by cuTile's front end)."""

from __future__ import annotations

import cuda.tile as ct


def load_zero_padded(A, index, shape, LAT):
    """Zero-padded tile load (TMA-friendly), with the ``latency=LAT`` hint when ``LAT > 0``."""
    if LAT > 0:
        t = ct.load(A, index, shape=shape, padding_mode=ct.PaddingMode.ZERO, latency=LAT)
    else:
        t = ct.load(A, index, shape=shape, padding_mode=ct.PaddingMode.ZERO)
    return t


def load_zero_padded_plain(A, index, shape, LAT):
    """:func:`load_zero_padded` without TMA (``allow_tma=False``): for kernels that also synchronise
    blocks through atomics (see ``cross_entropy_op``)."""
    if LAT > 0:
        t = ct.load(A, index, shape=shape, padding_mode=ct.PaddingMode.ZERO, latency=LAT, allow_tma=False)
    else:
        t = ct.load(A, index, shape=shape, padding_mode=ct.PaddingMode.ZERO, allow_tma=False)
    return t
