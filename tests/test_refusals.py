"""One clear line for inputs tiletune cannot use (issue 43): TILETUNE_DB, doctor, recording import."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tiletune import settings
from tiletune.cli import app
from tiletune.store import default_db_path

from test_importers import KT_CACHE


@pytest.fixture
def kt_path(tmp_path):
    p = tmp_path / "vector_add_A100.json"
    p.write_text(KT_CACHE)
    return p


@pytest.mark.parametrize("name", ["TILETUNE_DB", "TILETUNE_CACHE_DIR", "TILETUNE_PINS"])
def test_a_path_under_an_unknown_users_home_names_the_variable(monkeypatch, name):
    monkeypatch.setenv(name, "~nosuchuser_tiletune/x.db")
    expected = (f"{name}='~nosuchuser_tiletune/x.db': cannot expand '~nosuchuser_tiletune', no such user or home "
                "directory; give the full path")
    with pytest.raises(ValueError) as err:
        settings.path(name)
    assert str(err.value) == expected
    assert expected in settings.check_all()
    if name != "TILETUNE_PINS":
        monkeypatch.delenv("TILETUNE_DB" if name == "TILETUNE_CACHE_DIR" else "TILETUNE_CACHE_DIR", raising=False)
        with pytest.raises(ValueError, match=name):  # not pathlib's "Could not determine home directory."
            default_db_path()


def test_a_home_path_still_expands(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TILETUNE_DB", "~/t.db")
    assert default_db_path() == tmp_path / "t.db"


def test_the_cli_refuses_an_unknown_users_home_in_one_line(monkeypatch):
    r = CliRunner().invoke(app, ["db", "list"], env={"TILETUNE_DB": "~nosuchuser_tiletune/x.db"})
    assert r.exit_code == 2
    assert r.output.splitlines()[0] == ("error: TILETUNE_DB='~nosuchuser_tiletune/x.db': cannot expand "
                                        "'~nosuchuser_tiletune', no such user or home directory; give the full path")


def test_no_home_at_all_names_the_variables(monkeypatch):
    import pathlib

    for name in ("TILETUNE_DB", "TILETUNE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_home(cls=None):
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(pathlib.Path, "home", classmethod(no_home))
    with pytest.raises(ValueError, match="set TILETUNE_DB .* or TILETUNE_CACHE_DIR"):
        default_db_path()


def test_doctor_reports_a_database_path_that_is_a_directory(tmp_path):
    r = CliRunner().invoke(app, ["doctor"], env={"TILETUNE_DB": str(tmp_path), "COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    env_row = next(ln for ln in r.output.splitlines() if "environment" in ln)
    assert "environment ok" not in " ".join(env_row.split()).replace("│", "")
    assert f"TILETUNE_DB names {tmp_path}, a directory" in env_row


def test_doctor_is_ok_with_a_database_file_path(tmp_path):
    r = CliRunner().invoke(app, ["doctor"], env={"TILETUNE_DB": str(tmp_path / "t.db"), "COLUMNS": "400"})
    env_row = next(ln for ln in r.output.splitlines() if "environment" in ln)
    assert env_row.replace("│", " ").split() == ["environment", "ok"]


@pytest.mark.parametrize("arch", ["hopper", "90", "SM_90", "sm90", "sm_"])
def test_recording_import_refuses_an_arch_that_is_not_sm_xx(kt_path, tmp_path, arch):
    dest = tmp_path / "kt.json"
    r = CliRunner().invoke(app, ["recording", "import", str(kt_path), str(dest), "--arch", arch])
    assert r.exit_code == 2
    assert r.output.splitlines()[0] == f"error: --arch {arch!r} is not an architecture"
    assert not dest.exists()


@pytest.mark.parametrize("name", ["kt.txt", "kt.json.txt", "kt.gz", "kt", "kt.JSON"])
def test_recording_import_refuses_a_destination_it_cannot_read_back(kt_path, tmp_path, name):
    dest = tmp_path / name
    r = CliRunner().invoke(app, ["recording", "import", str(kt_path), str(dest), "--arch", "sm_90"])
    assert r.exit_code == 2
    assert r.output.splitlines()[0] == f"error: DEST {dest}: a recording is written as .json or .json.gz"
    assert not dest.exists()


@pytest.mark.parametrize("name, arch", [("kt.json", "sm_90"), ("kt.json.gz", "sm_100a"), ("kt.json", None)])
def test_recording_import_accepts_sm_archs_and_json_destinations(kt_path, tmp_path, name, arch):
    dest = tmp_path / name
    r = CliRunner().invoke(app, ["recording", "import", str(kt_path), str(dest)] + (["--arch", arch] if arch else []))
    assert r.exit_code == 0, r.output
    assert dest.exists()
