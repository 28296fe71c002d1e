"""The output folder: one PNG per job, one line per job in results.jsonl, written so that a crash
loses at most the jobs in flight and never duplicates one (no torch here).

    DIR/images/<id>.png    written to a temporary name in the same folder, fsynced, renamed (files.write_atomic)
    DIR/results.jsonl      one JSON line per finished job, appended with flush + fsync, after its PNG
    DIR/summary.md         rewritten (atomically) at the end of every run

A job is finished when its line is in results.jsonl and its PNG exists. A crash can leave a torn
last line (no newline, or not JSON): it is dropped on the next start, as is a line whose PNG is
gone, by rewriting results.jsonl atomically, so its job runs again and gets exactly one line.
One process writes a folder at a time (a lock file), so two runs cannot interleave their lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Iterable, Optional

from ..files import TEMP_PREFIX, write_atomic
from .jobs import BatchInputError

RESULTS_NAME = "results.jsonl"
SUMMARY_NAME = "summary.md"
IMAGES_DIR = "images"
LOCK_NAME = ".sjd-pac-batch.lock"


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
        for stale in self.images.glob(f"{TEMP_PREFIX}*"):  # PNGs a crash left half-written
            stale.unlink(missing_ok=True)
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
            except ValueError:
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

    def add(self, line: dict, png: bytes) -> None:
        """Store one finished job: its PNG first, then its line (flushed and fsynced)."""
        write_atomic(self.image_path(line["id"]), png)
        text = json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=float) + "\n"
        with open(self.results, "a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        self.lines[line["id"]] = line

    def finished(self, ids: Iterable[str]) -> Dict[str, dict]:
        return {i: self.lines[i] for i in ids if i in self.lines}

    def write_summary(self, text: str) -> Optional[Path]:
        path = self.folder / SUMMARY_NAME
        write_atomic(path, text.encode("utf-8"))
        return path
