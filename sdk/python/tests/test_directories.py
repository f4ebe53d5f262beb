"""Directories, stat, rename and usage through the gateway to a real agent (local cluster, real
operator): ``upload_dir``/``download_dir`` round trip with a mode and a symlink kept, ``stat`` and
``exists``, ``make_dir``, ``rename``, and ``metrics``."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchard_env import SandboxClient, _ops

from conftest import Cluster


def test_directories_round_trip_and_files_are_looked_at_and_moved(client: SandboxClient, cluster: Cluster, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "run.sh").write_text("#!/bin/sh\necho ok\n")
    (source / "pkg" / "run.sh").chmod(0o755)
    (source / "README").write_text("hello")
    os.symlink("README", source / "link")
    with client.create(image=cluster.image, ttl_seconds=600) as sbx:
        uploaded = sbx.upload_dir(source, "work")
        assert uploaded["path"].endswith("/work"), uploaded
        assert sbx.exec(["/bin/sh", "work/pkg/run.sh"]).stdout == "ok\n"
        assert sbx.stat("work/link")["type"] == "symlink"
        assert sbx.stat("work/README")["size"] == 5
        assert not sbx.exists("work/missing") and sbx.exists("work/pkg")
        sbx.make_dir("work/a/b")
        sbx.rename("work/README", "work/a/b/README")
        assert not sbx.exists("work/README")
        copied = sbx.download_dir("work", tmp_path / "back")
        assert "a/b/README" in copied, copied
        back = tmp_path / "back"
        assert (back / "a" / "b" / "README").read_text() == "hello"
        assert stat.S_IMODE((back / "pkg" / "run.sh").stat().st_mode) & 0o111, "the mode is kept"
        assert os.readlink(back / "link") == "README", "the symlink is kept, not followed"
        usage = sbx.metrics()
        assert isinstance(usage.get("diskPath"), str), usage


def test_a_local_path_that_is_not_a_directory_is_refused_before_any_request(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="local directory"):
        _ops.tar_of_directory(tmp_path / "f")


def test_extraction_never_leaves_the_target(tmp_path: Path) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("../escape")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        _ops.extract_tar(buffer.getvalue(), tmp_path / "in")
    assert not (tmp_path / "escape").exists()
