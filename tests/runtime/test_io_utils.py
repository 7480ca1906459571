"""Outputs written all-or-nothing: rename-aside-then-swap, recovery after a crash between the two renames, stale
temporaries of killed writers, and earlier results kept instead of overwritten."""

import os

import pytest

from gr_jax.runtime import io_utils


def _dead_pid() -> int:
    """A process id that no process has now: the highest free one below the kernel's limit (PIDs are handed
    out upwards from low numbers, so it stays free for the test's few milliseconds)."""
    try:
        top = int(open("/proc/sys/kernel/pid_max").read())
    except OSError:
        top = 32768
    for pid in range(top - 1, 1, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:  # alive, another user's
            continue
    raise AssertionError("no free process id")


def test_atomic_dir_replaces_and_cleans_up(tmp_path):
    out = tmp_path / "out"
    with io_utils.atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("one")
    with io_utils.atomic_dir(out) as tmp:
        (tmp / "b.txt").write_text("two")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]
    with pytest.raises(RuntimeError):
        with io_utils.atomic_dir(out) as tmp:
            (tmp / "c.txt").write_text("half")
            raise RuntimeError("killed")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]  # the failed write left nothing
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # and no temporary


def test_a_crash_between_the_two_renames_loses_nothing(tmp_path, monkeypatch):
    """The old output is renamed aside before the new one is renamed in; if the process dies in between, the
    next write to that path puts the old one back first."""
    out = tmp_path / "out"
    with io_utils.atomic_dir(out) as tmp:
        (tmp / "result").write_text("old")
    real_replace, calls = os.replace, []

    def crash_on_second(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between the renames")
        real_replace(src, dst)

    monkeypatch.setattr(io_utils.os, "replace", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        with io_utils.atomic_dir(out) as tmp:
            (tmp / "result").write_text("new")
    monkeypatch.setattr(io_utils.os, "replace", real_replace)
    assert not out.exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(".out.old-")]
    assert len(aside) == 1 and (aside[0] / "result").read_text() == "old"  # still on disk
    # the "killed" writer was this process: rename the leftover as a dead process would have left it
    dead = aside[0].with_name(f".out.old-{_dead_pid()}-0000")
    aside[0].rename(dead)
    io_utils.clean_stale(out)
    assert (out / "result").read_text() == "old" and not dead.exists()


def test_stale_temporaries_of_dead_writers_are_removed_live_ones_kept(tmp_path):
    dead, live = _dead_pid(), os.getppid()
    (tmp_path / f".run.txt.tmp-{dead}-ab12").write_text("half")
    (tmp_path / f".ckpt.tmp-{dead}-cd34").mkdir()
    (tmp_path / f".run.txt.tmp-{live}-ef56").write_text("being written")
    io_utils.write_text(tmp_path / "run.txt", "done")
    with io_utils.atomic_dir(tmp_path / "ckpt") as tmp:
        (tmp / "x").write_text("1")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f".run.txt.tmp-{live}-ef56", "ckpt", "run.txt"]


def test_keep_previous_keeps_a_different_result_and_not_an_identical_one(tmp_path, caplog):
    path = tmp_path / "metrics.json"
    io_utils.write_text(path, "A", keep_previous=True)
    io_utils.write_text(path, "A", keep_previous=True)  # a deterministic re-run: nothing to keep
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
    io_utils.write_text(path, "B", keep_previous=True)
    io_utils.write_text(path, "C", keep_previous=True)
    assert path.read_text() == "C"
    assert (tmp_path / "metrics.json.prev-1").read_text() == "A"
    assert (tmp_path / "metrics.json.prev-2").read_text() == "B"
    assert "kept as metrics.json.prev-2" in caplog.text
    io_utils.write_text(path, "D")  # without keep_previous (state the caller checked): replaced
    assert path.read_text() == "D" and not (tmp_path / "metrics.json.prev-3").exists()
    d = tmp_path / "report"
    for text in ("x", "x", "y"):
        with io_utils.atomic_dir(d, keep_previous=True) as tmp:
            (tmp / "r.md").write_text(text)
    assert (d / "r.md").read_text() == "y" and (tmp_path / "report.prev-1" / "r.md").read_text() == "x"
    assert not (tmp_path / "report.prev-2").exists()


def test_unwritable_destinations_are_clear_errors(tmp_path):
    (tmp_path / "file").write_text("I am a file")
    with pytest.raises(io_utils.FileFormatError, match=f"{tmp_path / 'file'} is a file, not a directory"):
        io_utils.write_text(tmp_path / "file" / "out.json", "{}")
    with pytest.raises(FileExistsError, match="exists"):
        with io_utils.atomic_dir(tmp_path / "file", overwrite=False):
            pass
    assert (tmp_path / "file").read_text() == "I am a file"
