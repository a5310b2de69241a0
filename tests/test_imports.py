"""tools/check_imports.py: the import graph's rules hold, and the checker can fail.

The checker runs as CI runs it (a subprocess); to show that it can fail, it
runs again on copies of the project's top-level modules with one rule broken.
"""

import shutil
import subprocess
import sys

import pytest
from support import ROOT

CHECKER = str(ROOT / "tools" / "check_imports.py")
LEAVES = ("obfs2", "obfs3", "obfs4", "obfs4_crypto", "socks")


def check(folder=None):
    command = [sys.executable, CHECKER] + ([str(folder)] if folder else [])
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def graph_of(stdout):
    """{module: [deps]} from the printed ``module -> deps`` lines."""
    graph = {}
    for line in stdout.splitlines():
        module, _, deps = line.partition(" -> ")
        graph[module] = [] if deps.startswith("(") else deps.split(", ")
    return graph


@pytest.fixture
def copy(tmp_path):
    """A copy of the project's top-level modules, to break."""
    for path in ROOT.glob("*.py"):
        shutil.copy(str(path), str(tmp_path / path.name))
    return tmp_path


def append(path, text):
    with open(str(path), "a", encoding="utf-8") as f:
        f.write(text)


def test_the_project_keeps_its_import_rules():
    result = check()
    assert result.returncode == 0, result.stderr
    graph = graph_of(result.stdout)
    assert set(graph) == {path.stem for path in ROOT.glob("*.py")}
    assert graph["obfs4"] == ["curve25519", "obfs4_crypto", "obfs4_drbg"]
    assert graph["relay"] == graph["webtunnel"] == graph["libcrypto"] == graph["pure_aes"] == []
    assert graph["accel"] == ["libcrypto", "pure_aes"]
    allowed = {"obfs4_crypto", "obfs4_drbg", "curve25519", "accel", "libcrypto", "pure_aes", "pure_salsa20"}
    assert all(set(graph[leaf]) <= allowed for leaf in LEAVES)
    assert "obfsproxy" not in [dep for deps in graph.values() for dep in deps]
    assert graph["proxy"] and "transports" in graph["proxy"]   # the graph is really read


def test_the_copy_passes_before_it_is_broken(copy):
    assert check(copy).returncode == 0


def test_a_cycle_fails(copy):
    append(copy / "outbound.py", "\n\ndef later():\n    import proxy  # noqa\n")
    result = check(copy)
    assert result.returncode == 1
    assert "import cycle" in result.stderr
    assert "outbound -> proxy" in result.stderr or "proxy -> outbound" in result.stderr


def test_importing_the_cli_fails(copy):
    (copy / "extra.py").write_text("from obfsproxy import main\n", encoding="utf-8")
    result = check(copy)
    assert result.returncode == 1
    assert "extra imports obfsproxy" in result.stderr
    assert "cycle" not in result.stderr


@pytest.mark.parametrize("leaf,dep", [("socks", "transports"), ("obfs3", "obfs2"),
                                      ("obfs4_crypto", "obfs4"), ("obfs2", "outbound"),
                                      ("relay", "listener"), ("relay", "proxy"),
                                      ("webtunnel", "outbound")])
def test_a_leaf_importing_the_project_fails(copy, leaf, dep):
    append(copy / ("%s.py" % leaf), "\nimport %s  # noqa\n" % dep)
    result = check(copy)
    assert result.returncode == 1
    assert "%s is a sans-IO leaf but imports %s" % (leaf, dep) in result.stderr


@pytest.mark.skipif(not hasattr(sys, "stdlib_module_names"), reason="Python names its stdlib from 3.10")
@pytest.mark.parametrize("module", ["relay", "webtunnel"])
def test_the_relay_and_webtunnel_may_use_the_standard_library_only(copy, module):
    append(copy / ("%s.py" % module), "\nimport Crypto  # noqa\n")
    result = check(copy)
    assert result.returncode == 1
    assert "%s may use the standard library only, but imports Crypto" % module in result.stderr


def test_a_file_that_does_not_parse_fails(copy):
    append(copy / "socks.py", "\ndef broken(:\n")
    result = check(copy)
    assert result.returncode == 1
    assert "socks.py" in result.stderr
