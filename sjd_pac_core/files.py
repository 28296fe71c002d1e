"""Writing result files so that nothing made is lost (no torch here).

    write_atomic(path, data)      readers see the old file or the whole new one, never a part: the
                                  bytes go to a temporary name in the same folder, are fsynced, then
                                  renamed over `path`; the file takes the mode a plain open() gives
                                  (0666 less the umask, or the mode of the file it replaces)
    append_durable(path, data)    the bytes appended and fsynced (a results log), mode as open() gives
    remove_stale_temps(folder)    temporary files a killed writer left in a folder, removed
    keep(path, data)              write_atomic, and when that fails (a full disk, a folder that went
                                  read-only) the same bytes go to a fresh folder in the temp dir;
                                  the answer says where, in one sentence
    check_file_name(path, flag)   a name the folder's file system can hold (its NAME_MAX), before any work
    interrupts_deferred()         Ctrl-C while files are written takes effect once they are all written
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Tuple, Union

TEMP_PREFIX = ".tmp-"
FALLBACK_PREFIX = "sjd-pac-kept-"
DEFAULT_NAME_MAX = 255  # where the file system does not say (pathconf is POSIX)


class FileSaveError(OSError):
    """Neither the file nor its fallback copy could be written; the message says why and what to do."""


TEMP_RANDOM = 8  # random characters in a temporary name (hex), as tempfile.mkstemp's
NEW_FILE_MODE = 0o666  # what open() asks for; the kernel takes the umask (and a default ACL) off
_OPEN_FLAGS = os.O_WRONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of `data` to `fd`, then fsync: the one low-level write of this module."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def _create_temp(folder: Path, suffix: str) -> Tuple[int, Path]:
    """A new file `.tmp-XXXXXXXX<suffix>` in `folder`, open for writing, created with the mode a
    plain open() gives (tempfile.mkstemp's are 0600 whatever the umask)."""
    for _ in range(100):
        temp = folder / f"{TEMP_PREFIX}{secrets.token_hex(TEMP_RANDOM // 2)}{suffix}"
        try:
            return os.open(temp, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, NEW_FILE_MODE), temp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")


def write_atomic(path: Union[str, Path], data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one, never a part.
    A new file gets the mode open() would give it; a replaced file keeps its mode."""
    path = Path(path)
    fd, temp = _create_temp(path.parent, path.suffix)
    try:
        try:
            with contextlib.suppress(FileNotFoundError):  # a file replaced keeps its mode, as under open()
                os.chmod(temp, os.stat(path).st_mode & 0o7777)
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def append_durable(path: Union[str, Path], data: bytes) -> None:
    """Append `data` to `path` (created with the mode open() gives), flushed to the disk."""
    fd = os.open(path, _OPEN_FLAGS | os.O_APPEND | os.O_CREAT, NEW_FILE_MODE)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def remove_stale_temps(folder: Union[str, Path], suffixes: Iterable[str]) -> int:
    """Remove the temporary files of write_atomic (with these suffixes) that a killed writer left in
    `folder`; only for a folder this process alone writes (it holds its lock). The count removed."""
    removed = 0
    for suffix in suffixes:
        for stale in Path(folder).glob(f"{TEMP_PREFIX}*{suffix}"):
            if stale.is_file():
                stale.unlink(missing_ok=True)
                removed += 1
    return removed


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
    limit = name_max(folder) - len(TEMP_PREFIX) - TEMP_RANDOM
    stem, suffix = os.path.splitext(name)
    while len((stem + suffix).encode()) > limit and stem:
        stem = stem[:-1]
    return stem + suffix


def check_file_name(path: Union[str, Path], flag: str = "--output") -> None:
    """Refuse a file name longer than its folder's file system allows (with write_atomic's temporary
    prefix), in one sentence, before any work."""
    path = Path(path)
    limit = name_max(path.parent) - len(TEMP_PREFIX) - TEMP_RANDOM
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
