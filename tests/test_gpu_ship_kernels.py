"""A script tunes a kernel of a package whose import is costly: the kernel reaches the tuning worker by
value (its function and its module's helpers), so the worker never imports that package, and the
session's checks, timing and winner are those of the real kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PACKAGE_INIT = textwrap.dedent(
    """
    import os
    with open(os.environ["HEAVYPKG_MARKER"], "a") as f:  # each process that imports the package
        f.write(f"{os.getpid()}\\n")
    """
)

KERNEL = textwrap.dedent(
    """
    import cuda.tile as ct

    ConstInt = ct.Constant[int]


    def _twice(x):
        return x * 2.0


    @ct.kernel
    def twice_kernel(X, Y, T: ConstInt):
        i = ct.bid(0)
        x = ct.load(X, index=(i,), shape=(T,), padding_mode=ct.PaddingMode.ZERO)
        ct.store(Y, (i,), _twice(x))
    """
)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    import cuda.tile as ct
    import tiletune as tt
    from heavypkg.kern import twice_kernel

    def plan(cfg, x, y):
        return tt.Launch(twice_kernel, (ct.cdiv(x.numel(), cfg.T),), (x, y, cfg.T))

    op = tt.autotune(tt.Space(T=[256, 512, 1024], occupancy=[1, 2]), reference=lambda x, y: x * 2, writes=["y"],
                     db=False, progress=False, name="ship_by_value")(plan)
    x = torch.randn(1 << 20, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    op(x, y)
    (res,) = op.results.values()
    ok = bool(torch.equal(y, x * 2))
    print("RESULT " + json.dumps({"pid": os.getpid(), "ok": ok, "isolation": res.stats.get("isolation"),
                                  "evaluations": res.stats.get("evaluations"),
                                  "failed": len(res.failures)}))
    """
)


def test_a_script_tunes_a_heavy_packages_kernel_without_the_worker_importing_it(tmp_path):
    pkg = tmp_path / "heavypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(PACKAGE_INIT)
    (pkg / "kern.py").write_text(KERNEL)
    marker = tmp_path / "imports.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    env.update(HEAVYPKG_MARKER=str(marker), CUDA_TILE_CACHE_DIR=str(tmp_path / "cutile"))
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=400)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    assert got["ok"] and got["isolation"] == "process" and got["failed"] == 0, got
    importers = marker.read_text().split()
    assert importers == [str(got["pid"])], importers  # the script imported heavypkg; no worker did
