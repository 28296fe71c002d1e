"""The output folder: one PNG per job, one line per job in results.jsonl, written so that a crash
loses at most the jobs in flight and never duplicates one (no torch here).

    DIR/images/<id>.png    written to a temporary name in the same folder, fsynced, renamed (files.write_atomic)
    DIR/results.jsonl      one JSON line per finished job, appended with flush + fsync, after its PNG
    DIR/summary.md         rewritten (atomically) at the end of every run
    DIR/.sjd-pac-model.json  the model the jobs were planned for (ModelInfo) and how it was asked
                           for: a rerun of the same command whose jobs are all finished loads nothing

A job is finished when its line is in results.jsonl and its PNG exists. A crash can leave a torn
last line (no newline, or not JSON): it is dropped on the next start, as is a line whose PNG is
gone, by rewriting results.jsonl atomically, so its job runs again and gets exactly one line; a
kill in the middle of a write leaves a temporary file, removed on the next start as well.
One process writes a folder at a time (a lock file), so two runs cannot interleave their lines.

Where the folder has no room for a finished PNG (a full disk), `add` keeps it in a folder of the
temp dir (files.keep) and writes no line: the driver stops the batch and says where it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional

from ..files import Kept, append_durable, keep, remove_stale_temps, write_atomic
from .jobs import BatchInputError, ModelInfo

RESULTS_NAME = "results.jsonl"
SUMMARY_NAME = "summary.md"
IMAGES_DIR = "images"
LOCK_NAME = ".sjd-pac-batch.lock"
MODEL_RECORD_NAME = ".sjd-pac-model.json"


class FolderLock:
    """An exclusive lock on the output folder for the life of a run (advisory, POSIX flock)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_NAME
        self.handle = None

    def __enter__(self) -> "FolderLock":
        try:
            import fcntl
        except ImportError:  # Windows: no flock; one run per folder is then the user's to keep
            return self
        self.handle = open(self.path, "a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.handle.close()
            self.handle = None
            raise BatchInputError(f"another sjd-pac batch is writing into {self.path.parent}; wait for it to "
                                  "finish or choose another --out.") from None
        return self

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self.handle.close()  # closing releases the lock
            self.handle = None


class ResultStore:
    """results.jsonl and images/ of one output folder; the driver is its only writer."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.results = self.folder / RESULTS_NAME
        self.images = self.folder / IMAGES_DIR
        self.lines: Dict[str, dict] = {}  # id -> its results line, finished jobs only
        self.dropped = 0  # lines dropped on load: a torn tail, or a PNG that is gone

    def image_path(self, job_id: str) -> Path:
        return self.images / f"{job_id}.png"

    def load(self) -> Dict[str, dict]:
        """The finished jobs, after dropping a torn tail and lines whose PNG is missing."""
        self.images.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.images, (".png",))  # PNGs a crash left half-written
        remove_stale_temps(self.folder, (".md", ".jsonl", ".json"))  # summary.md, results.jsonl, the model record
        raw = self.results.read_bytes() if self.results.exists() else b""
        kept, dropped = [], 0
        chunks = raw.split(b"\n")
        for number, chunk in enumerate(chunks, start=1):
            if not chunk.strip():
                continue
            if number == len(chunks):  # no newline after it: cut short by a crash; its job runs again
                dropped += 1
                continue
            try:
                line = json.loads(chunk)
            except (ValueError, RecursionError):
                line = None
            if not isinstance(line, dict) or not isinstance(line.get("id"), str):
                raise BatchInputError(
                    f"{self.results} line {number} is not a result line (damaged?); delete that line and rerun "
                    "(its job will run again).")
            if line["id"] in self.lines or not self.image_path(line["id"]).is_file():
                dropped += 1
                continue
            self.lines[line["id"]] = line
            kept.append(chunk)
        if dropped:
            write_atomic(self.results, b"".join(chunk + b"\n" for chunk in kept))
        self.dropped = dropped
        return self.lines

    def add(self, line: dict, png: bytes, fallback_dir: Optional[Path] = None) -> Kept:
        """Store one finished job: its PNG first, then its line (flushed and fsynced). A PNG the
        folder has no room for is kept in `fallback_dir` or the temp dir, with no line (Kept says
        where); OSError when the line cannot be appended (its PNG is in place, its job runs again)."""
        kept = keep(self.image_path(line["id"]), png, fallback_dir)
        if kept.moved:
            return kept
        text = json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=float) + "\n"
        append_durable(self.results, text.encode("utf-8"))
        self.lines[line["id"]] = line
        return kept

    def finished(self, ids: Iterable[str]) -> Dict[str, dict]:
        return {i: self.lines[i] for i in ids if i in self.lines}

    def write_summary(self, text: str, fallback_dir: Optional[Path] = None) -> Kept:
        """summary.md, kept in `fallback_dir` or the temp dir where the folder has no room."""
        return keep(self.folder / SUMMARY_NAME, text.encode("utf-8"), fallback_dir)

    # --- the model the jobs were planned for ----------------------------------------------------
    def recorded_model(self, request: Mapping[str, object]) -> Optional[ModelInfo]:
        """The ModelInfo an earlier run recorded for the same `request` (how the model was asked
        for), else None (none recorded, another request, or a record that cannot be read)."""
        path = self.folder / MODEL_RECORD_NAME
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if record["request"] != json.loads(json.dumps(request)):
                return None
            return ModelInfo.from_dict(record["model"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None

    def record_model(self, request: Mapping[str, object], info: ModelInfo) -> None:
        """Note the model a run planned for; a folder with no room for it only loses a shortcut."""
        text = json.dumps({"request": request, "model": info.to_dict()}, sort_keys=True)
        try:
            write_atomic(self.folder / MODEL_RECORD_NAME, text.encode("utf-8"))
        except OSError:
            pass
