"""cuTile kernels reached while shipping a plan travel by value (CPU).

A kernel a script's plan names goes to the worker with its Python function and the helpers of its module
that it calls, pickled by value: the worker never imports the kernel's package (TileGym's imports
transformers and every op). The kernels here are made by a stand-in for ``cuda.tile`` (registered in
``sys.modules`` for the test, and in the fresh interpreters that play the worker), except in the last
test, which compiles a real cuTile kernel shipped that way.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

pytest.importorskip("cloudpickle")

from tiletune import settings  # noqa: E402
from tiletune.devices.workers import shipping  # noqa: E402
from tiletune.devices.workers.zygote import plan_modules  # noqa: E402

FAKE_TILE = '''
"""A stand-in for cuda.tile: kernel objects that keep their Python function and compiler options."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class CompilerOptions:
    num_ctas: object = None
    occupancy: object = None
    opt_level: object = 3


class kernel:
    def __new__(cls, function=None, /, **options):
        if function is None:
            return lambda f: cls(f, **options)
        return super().__new__(cls)

    def __init__(self, function, /, **options):
        self._function = function
        self._compiler_options = CompilerOptions(**options)

    @property
    def _pyfunc(self):
        return self._function
'''

PACKAGE_INIT = '''
import os
# a heavy package (TileGym imports transformers here): every import of it is written down
with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as f:
    f.write(f"{os.getpid()}\\n")
'''

KERNELS = {
    "kern": '''
import math
import sys

ct = sys.modules["cuda.tile"]


def _helper(x):
    return 2 * x + 1


def _middle(x):
    return _helper(x) + math.floor(0.5)


@ct.kernel(occupancy=2)
def kernel_fn(x):
    return _middle(x) + 1
''',
    "locked": '''
import sys
import threading

ct = sys.modules["cuda.tile"]
_LOCK = threading.Lock()


def _helper(x):
    with _LOCK:
        return x + 1


@ct.kernel(occupancy=2)
def kernel_fn(x):
    return _helper(x)
''',
    "tensors": '''
import sys

import torch

ct = sys.modules["cuda.tile"]
_TABLE = torch.ones(3)


@ct.kernel(occupancy=2)
def kernel_fn(x):
    return x + int(_TABLE.sum())
''',
}

#: the worker's side: load the plan in a fresh interpreter (the stand-in cuda.tile registered first), call
#: it, and describe the kernel it returns
LOADER = r'''
import inspect, json, sys, types
sys.path.insert(0, sys.argv[1])
import fake_tile
cuda = types.ModuleType("cuda")
cuda.__path__ = []
cuda.tile = fake_tile
sys.modules["cuda"], sys.modules["cuda.tile"] = cuda, fake_tile
from tiletune.devices.workers.shipping import loads
plan = loads(sys.stdin.buffer.read())
kernel = plan(None, 3)[0]
f = kernel._pyfunc
helpers = [v for v in f.__globals__.values() if isinstance(v, types.FunctionType)]
print(json.dumps({
    "package_imported": "heavypkg" in sys.modules,
    "kernel_class": type(kernel).__module__ + "." + type(kernel).__name__,
    "value": f(3),
    "module": f.__module__,
    "qualname": f.__qualname__,
    "file": inspect.getfile(f),
    "source": inspect.getsource(f),
    "globals_file": f.__globals__.get("__file__"),
    "helpers": sorted(h.__name__ for h in helpers),
    "helpers_share_globals": all(h.__globals__ is f.__globals__ for h in helpers),
    "occupancy": kernel._compiler_options.occupancy,
}))
'''


@pytest.fixture
def heavy(tmp_path, monkeypatch):
    """The stand-in cuda.tile, registered as ``cuda.tile``, and the package ``heavypkg`` (imported here)."""
    (tmp_path / "fake_tile.py").write_text(FAKE_TILE)
    pkg = tmp_path / "heavypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(PACKAGE_INIT)
    for name, code in KERNELS.items():
        (pkg / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    fake = importlib.import_module("fake_tile")
    cuda = types.ModuleType("cuda")
    cuda.__path__ = []  # type: ignore[attr-defined]
    cuda.tile = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.tile", fake)
    monkeypatch.setattr(shipping, "_kernels", type(shipping._kernels)())
    monkeypatch.delenv("TILETUNE_SHIP_KERNELS", raising=False)
    yield types.SimpleNamespace(root=tmp_path, fake=fake, kern=importlib.import_module("heavypkg.kern"),
                                log=pkg / "imports.log")
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("heavypkg", "fake_tile", "userops"):
            del sys.modules[name]


def _plan_for(kernel):
    def plan(cfg, x):  # a closure: shipped by value, as a script's plan is
        return kernel, (x,)

    return plan


def _load_in_fresh_process(data: bytes, root: Path) -> dict:
    env = dict(os.environ, TILETUNE_WORKER_ZYGOTE="0", TILETUNE_WORKER_PRESTART="0")
    out = subprocess.run([sys.executable, "-c", LOADER, str(root)], input=data, capture_output=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def test_a_kernel_named_by_a_shipped_plan_travels_by_value_without_its_package(heavy):
    kern = heavy.kern
    assert heavy.log.read_text().split() == [str(os.getpid())]
    data = shipping.dumps(_plan_for(kern.kernel_fn))
    got = _load_in_fresh_process(data, heavy.root)
    assert got["package_imported"] is False
    assert heavy.log.read_text().split() == [str(os.getpid())]  # the worker never ran the package's __init__
    assert got["kernel_class"] == "fake_tile.kernel" and got["occupancy"] == 2
    assert got["value"] == kern.kernel_fn._pyfunc(3) == 8  # through _middle and _helper, rebuilt by value
    # cuTile resolves names in the function's globals and reads its source by file name; it mangles the
    # kernel's name from __module__ and __qualname__
    assert got["helpers"] == ["_helper", "_middle"] and got["helpers_share_globals"] is True
    assert (got["module"], got["qualname"]) == ("heavypkg.kern", "kernel_fn")
    assert got["file"] == got["globals_file"] == kern.__file__
    assert "return _middle(x) + 1" in got["source"]


@pytest.mark.parametrize("module", ["locked", "tensors"])
def test_a_kernel_that_cannot_go_by_value_goes_by_reference(heavy, module):
    """A lock cannot be pickled; a tensor must not travel inside a kernel: such kernels go as before."""
    if module == "tensors":
        pytest.importorskip("torch")
    mod = importlib.import_module(f"heavypkg.{module}")
    assert shipping._kernel_by_value(mod.kernel_fn) is None
    assert shipping._kernel_by_value(heavy.kern.kernel_fn) is not None
    got = _load_in_fresh_process(shipping.dumps(_plan_for(mod.kernel_fn)), heavy.root)
    assert got["package_imported"] is True  # the worker imported the kernel's module, and so its package
    assert got["value"] == mod.kernel_fn._pyfunc(3)
    assert len(heavy.log.read_text().split()) == 2


def test_the_worker_keeps_one_kernel_per_payload(heavy, monkeypatch):
    kernel = heavy.kern.kernel_fn
    first, again = shipping.dumps(kernel), shipping.dumps(kernel)
    assert first == again  # the same kernel pickles to the same bytes: the digest finds it in the worker
    a, b = shipping.loads(first), shipping.loads(again)
    assert a is b and isinstance(a, heavy.fake.kernel) and a is not kernel
    assert a._pyfunc is not kernel._pyfunc and a._pyfunc(3) == 8  # a copy, by value
    other = shipping.loads(shipping.dumps(heavy.fake.kernel(kernel._pyfunc, occupancy=4)))
    assert other is not a and other._compiler_options.occupancy == 4  # other options: another kernel
    assert a._compiler_options.occupancy == 2

    monkeypatch.setattr(shipping, "KERNEL_MEMO_SIZE", 2)
    shipping._kernels.clear()
    payloads = [shipping.dumps(heavy.fake.kernel(kernel._pyfunc, occupancy=n)) for n in (1, 2, 3)]
    loaded = [shipping.loads(p) for p in payloads]
    assert len(shipping._kernels) == 2  # bounded: the least recently used went
    assert shipping.loads(payloads[2]) is loaded[2] and shipping.loads(payloads[0]) is not loaded[0]


def test_ship_kernels_reference_restores_the_import(heavy, monkeypatch):
    monkeypatch.setenv("TILETUNE_SHIP_KERNELS", "reference")
    assert settings.ship_kernels() == "reference"
    got = _load_in_fresh_process(shipping.dumps(_plan_for(heavy.kern.kernel_fn)), heavy.root)
    assert got["package_imported"] is True and got["value"] == 8
    monkeypatch.setenv("TILETUNE_SHIP_KERNELS", " Value ")
    assert settings.ship_kernels() == "value"
    monkeypatch.setenv("TILETUNE_SHIP_KERNELS", "copy")
    msg = "TILETUNE_SHIP_KERNELS='copy': choose one of value, reference (or unset it)"
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        shipping.dumps(_plan_for(heavy.kern.kernel_fn))
    assert settings.check_all() == [msg]


USER_OPS = '''
from heavypkg.kern import kernel_fn


class _Op:  # what @tt.autotune binds to the plan's name
    def __init__(self, plan):
        self.plan = plan


def plan(cfg, x):
    return kernel_fn, (x,)


PLAN = plan
plan = _Op(plan)


def later(cfg, x):  # a plan being decorated: its name is bound once its op is made
    return kernel_fn, (x,)


LATER = later
del later
'''


def test_plan_modules_leaves_out_kernels_that_travel_by_value(heavy, monkeypatch):
    ns: dict = {"__name__": "__main__", "KERNEL": heavy.kern.kernel_fn, "json": json}
    exec(textwrap.dedent('''
        def plan(cfg, x):
            return KERNEL, (json.dumps(x),)
    '''), ns)
    mods = plan_modules([ns["plan"]])
    assert "heavypkg.kern" not in mods and "heavypkg" not in mods  # the kernel goes by value
    assert "json" in mods and "math" in mods  # what the plan and the kernel's helpers name: imported there
    monkeypatch.setenv("TILETUNE_SHIP_KERNELS", "reference")
    assert "heavypkg.kern" in plan_modules([ns["plan"]])
    monkeypatch.setenv("TILETUNE_SHIP_KERNELS", "copy")
    assert "heavypkg.kern" in plan_modules([ns["plan"]])  # an invalid value: listed (dumps reports it)
    monkeypatch.delenv("TILETUNE_SHIP_KERNELS")

    (heavy.root / "userops.py").write_text(USER_OPS)
    userops = importlib.import_module("userops")
    for plan in (userops.PLAN, userops.LATER):  # imported by name in the worker: its module and kernels listed
        mods = plan_modules([plan])
        assert mods[0] == "userops" and "heavypkg.kern" in mods, mods


REAL_KERNEL = '''
import cuda.tile as ct

ConstInt = ct.Constant[int]


def first_block(n):
    return ct.bid(0) % n


@ct.kernel(occupancy=2)
def twice_kernel(X, Y, T: ConstInt):
    i = first_block(1)
    ct.store(Y, (i,), ct.load(X, index=(i,), shape=(T,)) * 2)
'''

REAL_WORKER = r'''
import sys
sys.path.insert(0, sys.argv[1])
from types import SimpleNamespace

import cuda.tile as ct
from cuda.tile._cext import default_tile_context
from cuda.tile.compilation import ArrayConstraint, CallingConvention, ConstantConstraint, KernelSignature

from tiletune.devices import frontend_cache
from tiletune.devices.workers.shipping import loads

kernel = loads(sys.stdin.buffer.read())(None, None)[0]
arr = dict(index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(), may_alias_internally=False)
sig = KernelSignature([ArrayConstraint(ct.float32, 1, **arr), ArrayConstraint(ct.float32, 1, **arr),
                       ConstantConstraint(16)], CallingConvention.cutile_python_v1())
ctx = SimpleNamespace(config=SimpleNamespace(**{**vars(default_tile_context.config), "cache_dir": sys.argv[2]}))
cubin, symbol = kernel._compile(sig, ctx, (9, 0))[:2]
print(cubin[:4] == b"\x7fELF", symbol, "realheavypkg" in sys.modules, frontend_cache.code_fingerprint(kernel._pyfunc))
'''


def test_a_real_cutile_kernel_shipped_by_value_compiles_in_a_fresh_process(tmp_path, monkeypatch):
    """cuTile's front end parses the rebuilt kernel's source, resolves its helper by name and compiles
    (``tileiras`` for sm_90 runs without a GPU); the package is not imported; the front-end cache key
    is the caller's."""
    pytest.importorskip("cuda.tile")
    from tiletune.devices import frontend_cache

    pkg = tmp_path / "realheavypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(PACKAGE_INIT)
    (pkg / "kern.py").write_text(REAL_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TILETUNE_SHIP_KERNELS", raising=False)
    for v in ("CUDA_TILE_LOGS", "CUDA_TILE_DUMP_TILEIR", "CUDA_TILE_DUMP_BYTECODE"):
        monkeypatch.delenv(v, raising=False)
    try:
        kern = importlib.import_module("realheavypkg.kern")
        data = shipping.dumps(_plan_for(kern.twice_kernel))
        assert b"_rebuild_kernel_from_bytes" in data
        env = dict(os.environ, TILETUNE_WORKER_ZYGOTE="0", TILETUNE_WORKER_PRESTART="0")
        out = subprocess.run([sys.executable, "-c", REAL_WORKER, str(tmp_path), str(tmp_path / "cache")],
                             input=data, capture_output=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr.decode()[-3000:]
        elf, symbol, imported, fingerprint = out.stdout.decode().split()[-4:]
        assert elf == "True" and symbol.startswith("twice_kernel_") and imported == "False"
        assert fingerprint == frontend_cache.code_fingerprint(kern.twice_kernel._pyfunc)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "realheavypkg"]:
            del sys.modules[name]
    assert inspect.isfunction(kern.twice_kernel._pyfunc)
