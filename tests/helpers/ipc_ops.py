"""A tiny tuned op for the CUDA IPC tests (tests/test_gpu_ipc.py): ``y = 2 * x`` over a float32 vector,
a space of two configs, and an int ``tag`` that only makes the key (every new tag tunes again)."""

from __future__ import annotations

import cuda.tile as ct

import tiletune as tt


@ct.kernel
def double_kernel(X, Y, T: ct.Constant[int]):
    bid = ct.bid(0)
    offs = bid * T + ct.arange(T, dtype=ct.int32)
    ct.scatter(Y, offs, ct.gather(X, offs) * 2.0)


SPACE = tt.Space(T=[256, 1024], baseline=dict(T=256))


def double_plan(cfg, x, y, tag):
    return tt.Launch(double_kernel, ((x.shape[0] + cfg.T - 1) // cfg.T,), (x, y, cfg.T))


def make_double_op(name: str = "ipc_double") -> tt.TunedOp:
    """The op, tuned in a worker process (the default isolation), with no database."""
    return tt.autotune(SPACE, reference=lambda x, y, tag: x * 2, writes=["y"], db=False, name=name,
                       progress=False)(double_plan)
