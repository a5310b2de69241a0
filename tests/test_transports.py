"""transports.py: the contract, the registry, and the recorder."""

import os

import pytest

import transports


def test_recordings_are_readable_by_their_owner_only(tmp_path):
    directory = tmp_path / "rec"
    transport = transports.RecordDir(directory).wrap(transports.Dummy(True))
    transport.send(b"secret traffic")
    if os.name != "posix":
        pytest.skip("POSIX permission bits")
    assert directory.stat().st_mode & 0o077 == 0
    files = list(directory.iterdir())
    assert files and all(path.stat().st_mode & 0o077 == 0 for path in files)
