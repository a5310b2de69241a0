import sys
from pathlib import Path

import pytest

# Tests import the top-level modules (obfs2, socks, obfsproxy) and the harness.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import testca  # noqa: E402  (the harness, found through the path above)

# --- The test CA for wt.test (tests/testca.py), for the webtunnel tests --------------

@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return testca.make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    """A second CA: a client trusting only this one cannot verify the wt.test certificate."""
    return testca.make_ca(tmp_path_factory.mktemp("other-ca"))
