"""``python -m tiletune``: the ``tiletune`` command line (:mod:`tiletune.cli`)."""

from tiletune.cli import app

if __name__ == "__main__":
    app(prog_name="tiletune")
