"""Recorded spaces: the tiletune recording format and importers of public recorded spaces.

* :mod:`.format`: the ``tiletune-recording`` document (:data:`FORMAT`, :func:`save_recording`,
  :class:`Recording`, :class:`RecordedConfigs`) and :func:`load_any`, which tells the three
  formats apart, and :func:`import_recording` (what ``tiletune recording import`` does: validate
  everything, then write atomically, keeping the source's date);
* :mod:`.kernel_tuner`: Kernel Tuner's JSON cache files (:meth:`Recording.from_kernel_tuner_cache`);
* :mod:`.t4`: the T4 auto-tuning results format (:meth:`Recording.from_t4`).

Every reader validates what it reads and raises :class:`tiletune.errors.InvalidRecording` naming the
file and the field; the limits (file size, nesting depth, numbers) are in :mod:`tiletune.jsonio`.

Replaying a recording through the tuning loop is a backend's job:
:class:`tiletune.lab.recordings.replay.ReplayBackend`.
"""

from __future__ import annotations

from tiletune.lab.recordings.format import FORMAT, RecordedConfigs, Recording, import_recording, load_any, save_recording

__all__ = ["FORMAT", "RecordedConfigs", "Recording", "import_recording", "load_any", "save_recording"]
