"""The command line on a machine without a GPU, and ``python -m tiletune`` (issue 43)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiletune.cli import app

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_python_dash_m_tiletune_is_the_command_line():
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "tiletune", "--help"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Usage: tiletune" in out.stdout
    for command in ("tune", "ab", "doctor", "db", "recording", "demo"):
        assert command in out.stdout


@pytest.mark.parametrize("command", ["tune", "ab"])
def test_library_ops_without_a_gpu_fail_early_with_one_line(monkeypatch, command):
    monkeypatch.setattr("tiletune.cli._gpu_available", lambda: False)
    r = CliRunner().invoke(app, [command, "rms_norm"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert lines[0] == f"error: tiletune {command}: needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is False)"
    assert len(lines) == 2 and lines[1].startswith("hint: run it on a machine with a CUDA GPU")
    assert "unexpected error" not in r.output


def test_tune_on_this_machine_says_a_gpu_is_needed():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")  # the test above covers the message everywhere
    r = CliRunner().invoke(app, ["tune", "rms_norm"])
    assert r.exit_code == 2 and "needs an NVIDIA GPU with CUDA" in r.output
