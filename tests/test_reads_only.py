"""A reference marked ``reads_only`` gets the caller's unwritten arguments as they are; any other reference
gets copies of every argument (tiletune.devices.verify)."""

import pytest
import torch

from tiletune.devices.verify import READS_ONLY_ATTR, ArgGuard, Checker, reads_only


def _args():
    x = torch.arange(8, dtype=torch.float32)  # read
    s = torch.ones(8)  # read and written in place
    y = torch.zeros(8)  # written
    return x, s, y


@pytest.mark.parametrize("marked", [False, True])
def test_the_unwritten_arguments_reach_a_reads_only_reference_uncopied(marked):
    x, s, y = _args()
    seen = []

    def reference(a, b, c):
        seen.append((a, b, c))
        return a * 2, b + a

    if marked:
        assert reads_only(reference) is reference and getattr(reference, READS_ONLY_ATTR)
    guard = ArgGuard((x, s, y), outputs=(2,), inplace=(1,))
    checker = Checker(reference, guard)
    (a, b, c), = seen
    assert (a is x) == marked and torch.equal(a, x)  # the read-only argument: itself only when marked
    assert b is not s and c is not y  # written arguments: always copies (of their saved pristine contents)
    assert b is not guard.saved[1] and c is not guard.saved[2]
    torch.testing.assert_close(checker.expected[0], x * 2)


def test_an_unmarked_reference_that_writes_its_input_leaves_the_callers_tensor_alone():
    x, s, y = _args()

    def careless(a, b, c):
        a.add_(100)  # writes an argument it should only read
        return a.clone(), b

    Checker(careless, ArgGuard((x, s, y), outputs=(2,), inplace=(1,)))
    assert torch.equal(x, torch.arange(8, dtype=torch.float32))


def test_every_library_reference_is_marked_reads_only():
    pytest.importorskip("cuda.tile")
    import importlib

    from tiletune.kernels.library_op import LibraryOp

    for mod in ("norms", "glu", "rope", "softmax_op", "cross_entropy_op", "gemm", "gemm_glu", "attention_op",
                "decode_attention_op"):
        importlib.import_module(f"tiletune.kernels.{mod}")
    ops = [lib for lib in LibraryOp.instances() if lib.reference is not None]
    assert len(ops) >= 10
    assert all(getattr(lib.reference, READS_ONLY_ATTR, False) for lib in ops), [
        lib.name for lib in ops if not getattr(lib.reference, READS_ONLY_ATTR, False)]
