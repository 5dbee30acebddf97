"""ops.atomic_write: readers never see half a file, failures leave nothing behind, permissions as open()."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

import opstrata.ops as ops


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("data", [b"\x00bytes", "text \u00e9", lambda f: np.save(f, np.arange(3))])
def test_writes_bytes_text_or_through_a_callable(tmp_path, data) -> None:
    p = ops.atomic_write(tmp_path / "out.bin", data, fsync=True)
    raw = p.read_bytes()
    if isinstance(data, bytes):
        assert raw == data
    elif isinstance(data, str):
        assert raw.decode("utf-8") == data
    else:
        assert np.load(p).tolist() == [0, 1, 2]
    assert os.listdir(tmp_path) == ["out.bin"]  # no temp file left


def test_permissions_follow_the_umask_like_open(tmp_path) -> None:
    """mkstemp makes 0600 files; the result must be readable as a plain open() would make it."""
    old = os.umask(0o022)
    try:
        p = ops.atomic_write(tmp_path / "m.onnx", b"x")
        q = tmp_path / "plain"
        q.write_bytes(b"x")
        assert stat.S_IMODE(p.stat().st_mode) == stat.S_IMODE(q.stat().st_mode) == 0o644
        os.umask(0o077)
        assert stat.S_IMODE(ops.atomic_write(tmp_path / "private", b"x").stat().st_mode) == 0o600
    finally:
        os.umask(old)
    assert _umask() == old


def test_a_failing_writer_keeps_the_old_file_and_no_temp(tmp_path) -> None:
    p = tmp_path / "keep.txt"
    p.write_text("old")

    def boom(f) -> None:
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        ops.atomic_write(p, boom)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["keep.txt"]
    with pytest.raises(FileNotFoundError):
        ops.atomic_write(tmp_path / "missing_dir" / "x", b"x")
