"""Result files are written whole or not at all, and a failed write keeps what was made
(sjd_pac_core/files.py; the CLI, the benchmark and the app write through it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sjd_pac_core import files

REPO = Path(__file__).resolve().parent.parent


def test_write_atomic_replaces_whole_or_leaves_the_old_file(tmp_path, full_folder):
    target = tmp_path / "r.json"
    files.write_atomic(target, b"old")
    files.write_atomic(target, b"new" * 1000)
    assert target.read_bytes() == b"new" * 1000
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(files.TEMP_PREFIX)] == []
    with pytest.raises(OSError):
        files.write_atomic(full_folder / "r.json", os.urandom(64 << 10))
    assert not (full_folder / "r.json").exists()
    assert [p.name for p in full_folder.iterdir() if p.name.startswith(files.TEMP_PREFIX)] == []


def test_keep_on_a_full_disk_writes_to_the_temp_dir_and_says_where(full_folder, tmp_path, monkeypatch):
    data = os.urandom(64 << 10)
    kept = files.keep(full_folder / "out.png", data)
    assert kept.moved and kept.path.read_bytes() == data and kept.path.name == "out.png"
    assert str(full_folder / "out.png") in kept.note and str(kept.path) in kept.note
    assert kept.note.count(". ") == 0 and kept.note.endswith("instead.")  # one sentence
    second = files.keep(full_folder / "out.md", b"x", fallback_dir=kept.path.parent)
    assert second.path.parent == kept.path.parent  # files that belong together stay together
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda prefix: str(full_folder))
    with pytest.raises(files.FileSaveError, match="free some disk space"):
        files.keep(full_folder / "again.png", data)
    assert files.keep(tmp_path / "fine.png", b"y") == files.Kept(tmp_path / "fine.png")


@pytest.mark.parametrize("name, ok", [("a" * 200 + ".png", True), ("a" * 300 + ".png", False),
                                      ("é" * 130 + ".png", False)])
def test_a_file_name_too_long_for_its_folder_is_one_sentence(tmp_path, name, ok):
    if ok:
        files.check_file_name(tmp_path / name)
        files.write_atomic(tmp_path / name, b"x")  # the temporary name fits as well
        return
    with pytest.raises(ValueError, match="choose a shorter name") as info:
        files.check_file_name(tmp_path / name, "--output")
    assert str(info.value).startswith("--output: the file name") and str(info.value).count(";") == 1
    assert files.fitting_name(name, tmp_path).endswith(".png")
    fitted = files.fitting_name(name, tmp_path)
    assert len(fitted.encode()) + len(files.TEMP_PREFIX) + 8 <= files.name_max(tmp_path)
    files.write_atomic(tmp_path / fitted, b"x")


@pytest.fixture
def python_ctrl_c():
    """Ctrl-C raising KeyboardInterrupt, as in a terminal, whatever this process inherited (a
    background job or nohup starts it with SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_ignored_ctrl_c_stays_ignored_while_writing(tmp_path):
    """Under nohup or in a background job SIGINT is ignored: the block must not turn it into a
    KeyboardInterrupt, and leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with files.interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            files.write_atomic(tmp_path / "a.bin", b"z")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_writing_takes_effect_after_the_writes(tmp_path, python_ctrl_c):
    written = []
    with pytest.raises(KeyboardInterrupt):
        with files.interrupts_deferred():
            for i in range(3):
                if i == 0:
                    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during the first file
                files.write_atomic(tmp_path / f"{i}.bin", b"z" * 1000)
                written.append(i)
    assert written == [0, 1, 2] and all((tmp_path / f"{i}.bin").stat().st_size == 1000 for i in range(3))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_generate_with_ctrl_c_during_the_writes_keeps_every_image(tmp_path, monkeypatch, python_ctrl_c):
    """A real `sjd-pac generate --batch-size 3`, interrupted (SIGINT) while its first PNG is written:
    every image is written whole, then it stops with "interrupted"."""
    from PIL import Image

    from sjd_pac_core.cli import main

    real_write = os.write
    sent = []

    def write(fd, data):
        if not sent and os.path.realpath(f"/proc/self/fd/{fd}").endswith(".png"):
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    out = tmp_path / "out.png"
    code = main(["generate", "a red circle on a blue background", "-o", str(out), "--batch-size", "3",
                 "--method", "sjd", "--quiet"])
    assert sent and code == 130
    for i in range(3):
        with Image.open(tmp_path / f"out_{i}.png") as image:
            image.load()  # whole, readable
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(files.TEMP_PREFIX)]


def test_generate_on_a_full_disk_keeps_the_images_and_says_where(full_folder, capsys):
    from PIL import Image

    from sjd_pac_core.cli import main

    # the folder check passes (a file can be created), the disk fills up before the images are written
    code = main(["generate", "a red circle on a blue background", "-o", str(full_folder / "out.png"),
                 "--batch-size", "2", "--method", "sjd", "--quiet"])
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning: could not write")]
    assert code == 0 and len(warnings) == 2 and "Traceback" not in captured.err, captured.err
    for line in warnings:
        kept = Path(line.split("kept it as ", 1)[1].rsplit(" instead.", 1)[0])
        with Image.open(kept) as image:
            assert "sjd_pac" in image.text


def test_generate_refuses_a_300_character_file_name_before_torch(tmp_path):
    code = ("import sys; from sjd_pac_core.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules, file=sys.stderr); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "generate", "a red circle", "-o",
                           str(tmp_path / ("a" * 300 + ".png"))], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1] == "False", proc.stderr
    assert lines[0].startswith("error: --output: the file name") and "shorter name" in lines[0]


def test_bench_results_on_a_full_disk_go_together_to_the_temp_dir(full_folder, capsys):
    from sjd_pac_core.bench.report import keep_all

    paths = keep_all({"json": (full_folder / "results.json", "{}" + " " * 70000),
                      "markdown": (full_folder / "results.md", "# r\n" * 20000)})
    assert paths["json"].parent == paths["markdown"].parent != full_folder
    assert paths["json"].read_text().startswith("{}")
    assert capsys.readouterr().err.count("warning: could not write") == 2


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_written_files_take_the_mode_open_gives(tmp_path, umask):
    """A new file gets 0666 less the umask, as a plain open() gives it (mkstemp's 0600 made images
    and summaries unreadable to a web server or a shared ComfyUI folder); a file replaced keeps
    its mode; an appended log is created the same way."""
    previous = os.umask(umask)
    try:
        with open(tmp_path / "plain", "wb"):
            pass
        files.write_atomic(tmp_path / "new.png", b"png")
        files.append_durable(tmp_path / "log.jsonl", b"{}\n")
        kept = files.keep(tmp_path / "kept.md", b"x")
    finally:
        os.umask(previous)
    expected = 0o666 & ~umask
    assert (tmp_path / "plain").stat().st_mode & 0o777 == expected  # the control: what open() gives
    for name in ("new.png", "log.jsonl", "kept.md"):
        assert (tmp_path / name).stat().st_mode & 0o777 == expected, name
    assert kept.path == tmp_path / "kept.md"
    os.chmod(tmp_path / "new.png", 0o640)
    files.write_atomic(tmp_path / "new.png", b"png again")
    assert (tmp_path / "new.png").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "new.png").read_bytes() == b"png again"


def test_stale_temporary_files_of_a_killed_writer_are_removed(tmp_path):
    (tmp_path / f"{files.TEMP_PREFIX}ab12cd34.md").write_text("half a summary")
    (tmp_path / f"{files.TEMP_PREFIX}ab12cd34.png").write_text("another writer's")
    (tmp_path / "keep.md").write_text("mine")
    assert files.remove_stale_temps(tmp_path, (".md",)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{files.TEMP_PREFIX}ab12cd34.png", "keep.md"]
