"""A local campaign worker process: ``python -m tiletune.lab.campaign.worker_main``.

Started by :class:`tiletune.lab.campaign.pool.LocalPool`, one per GPU (``CUDA_VISIBLE_DEVICES`` names
it). It reads JSON lines on stdin (the setup first, then ``{"run": task, "upcoming": [...]}`` or
``{"exit": true}``) and writes JSON lines on its original stdout (``{"ready": info}``, then one
``{"result": ...}`` per task); anything the ops print goes to stderr (the worker's log). When its
caller goes away (stdin closes, e.g. the campaign was killed) it stops at once, with its own
tuning worker.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import traceback
from typing import Any


def _die() -> None:
    try:
        from tiletune.devices.workers import shutdown_all

        shutdown_all()
    finally:
        os._exit(0)


def main() -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # prints of the ops go to the log, never into the protocol
    sys.stdout = sys.stderr
    send_lock = threading.Lock()

    def send(msg: dict[str, Any]) -> None:
        line = json.dumps(msg, allow_nan=False)
        with send_lock:
            proto.write(line + "\n")
            proto.flush()

    inbox: "queue.Queue[dict[str, Any]]" = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            if line.strip():
                inbox.put(json.loads(line))
        _die()  # the caller is gone (or closed our stdin): stop now, whatever is running

    setup_line = sys.stdin.readline()
    try:
        from tiletune.lab.campaign.runner import CampaignRunner

        runner = CampaignRunner(json.loads(setup_line))
        send({"ready": runner.info()})
    except BaseException as exc:  # noqa: BLE001 - reported to the caller, then exit
        send({"failed": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]})
        _die()
    threading.Thread(target=read, name="tiletune-campaign-stdin", daemon=True).start()
    while True:
        msg = inbox.get()
        if msg.get("exit"):
            break
        result = runner.run(msg["run"], msg.get("upcoming", []))
        send({"result": result})
    _die()


if __name__ == "__main__":
    main()
