"""Writing result files so that nothing made is lost (no torch here).

    write_atomic(path, data)      readers see the old file or the whole new one, never a part: the
                                  bytes go to a temporary name in the same folder, are fsynced, then
                                  renamed over `path`
    keep(path, data)              write_atomic, and when that fails (a full disk, a folder that went
                                  read-only) the same bytes go to a fresh folder in the temp dir;
                                  the answer says where, in one sentence
    check_file_name(path, flag)   a name the folder's file system can hold (its NAME_MAX), before any work
    interrupts_deferred()         Ctrl-C while files are written takes effect once they are all written
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Union

TEMP_PREFIX = ".tmp-"
FALLBACK_PREFIX = "sjd-pac-kept-"
DEFAULT_NAME_MAX = 255  # where the file system does not say (pathconf is POSIX)


class FileSaveError(OSError):
    """Neither the file nor its fallback copy could be written; the message says why and what to do."""


def write_atomic(path: Union[str, Path], data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=path.suffix, dir=path.parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make a rename durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Kept:
    """Where `keep` put the bytes, and the one sentence to show when it was not where asked."""

    path: Path
    note: str = ""

    @property
    def moved(self) -> bool:
        return bool(self.note)


def _reason(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


def keep(path: Union[str, Path], data: bytes, fallback_dir: Optional[Path] = None) -> Kept:
    """Write `data` to `path`; if that fails, to `fallback_dir` or a new folder in the temp dir
    (FileSaveError if both fail). Files that belong together share the first one's fallback folder."""
    path = Path(path)
    try:
        write_atomic(path, data)
        return Kept(path)
    except OSError as exc:
        first = exc
    try:
        folder = fallback_dir or Path(tempfile.mkdtemp(prefix=FALLBACK_PREFIX))
        fallback = folder / fitting_name(path.name, folder)
        write_atomic(fallback, data)
    except OSError as exc:
        raise FileSaveError(
            f"could not write {path} ({_reason(first)}) nor a copy in {tempfile.gettempdir()} ({_reason(exc)}); "
            "free some disk space and run again") from None
    return Kept(fallback, f"could not write {path} ({_reason(first)}); kept it as {fallback} instead.")


def name_max(folder: Union[str, Path]) -> int:
    """The longest file name (in bytes) the folder's file system takes."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):
        return DEFAULT_NAME_MAX


def fitting_name(name: str, folder: Union[str, Path]) -> str:
    """`name`, its stem cut so that it (with the temporary prefix of write_atomic) fits the folder."""
    limit = name_max(folder) - len(TEMP_PREFIX) - 8  # mkstemp adds 8 random characters
    stem, suffix = os.path.splitext(name)
    while len((stem + suffix).encode()) > limit and stem:
        stem = stem[:-1]
    return stem + suffix


def check_file_name(path: Union[str, Path], flag: str = "--output") -> None:
    """Refuse a file name longer than its folder's file system allows (with write_atomic's temporary
    prefix), in one sentence, before any work."""
    path = Path(path)
    limit = name_max(path.parent) - len(TEMP_PREFIX) - 8
    size = len(path.name.encode())
    if size > limit:
        raise ValueError(f"{flag}: the file name {path.name[:40]}... is {size} bytes long, more than the "
                         f"{limit} this folder takes; choose a shorter name.")


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[List[int]]:
    """Inside the block Ctrl-C (SIGINT) is noted, not raised; it is raised as KeyboardInterrupt when the
    block ends, so that files being written are all finished first. Elsewhere than the main thread
    signals cannot be handled here, and where Ctrl-C does not raise KeyboardInterrupt anyway (it is
    ignored, as under nohup or in a background job, or another handler is set) the block runs as
    it is."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield []
        return
    caught: List[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
