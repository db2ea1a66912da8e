"""Example kernels and tuned ops that are not library ops: the fixtures of benchmarks, demos and tests.

* :mod:`.simple_matmul` and :mod:`.matmul_kernels`: a one-tile-per-block bf16/fp16 matmul (32
  configs), the kernel of the tuning-speed, warm-start, determinism, fault-matrix and profile
  benchmarks, of ``tiletune demo`` and of the recorded spaces;
* :mod:`.rmsnorm` and :mod:`.rmsnorm_kernels`: a persistent RMSNorm (4 configs), the second op of
  ``tiletune demo`` and of the tuning-speed benchmark;
* :mod:`.layernorm_kernels`: the LayerNorm kernel of the recorded 16384 x 4096 space
  (``benchmarks/record_spaces.py``).

Their kernels and launch plans are kept byte for byte: a tuned op's identity in a database is the
source of its plan and kernels, so recorded results and databases keep matching. The op library is
:mod:`tiletune.kernels`.
"""
