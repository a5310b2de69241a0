"""tools/check_imports.py: the import graph's rules hold, and the checker can fail;
and the layout it checks: the root's modules carry a tunnel without teaching/.

The checker runs as CI runs it (a subprocess); to show that it can fail, it
runs again on copies of the project's modules with one rule broken.
"""

import ast
import shutil
import subprocess
import sys

import pytest
from support import PROGRAM, ROOT, EchoServer, Program, copy_runtime, echo_round_trip, fmt, socks5_connect

CHECKER = str(ROOT / "tools" / "check_imports.py")
LEAVES = ("obfs2", "obfs3", "obfs4", "obfs4_crypto", "obfs4_state", "socks")


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


def modules():
    """The project's module names as the checker names them: the root's, teaching.*
    and cryptoroutes.*."""
    names = {path.stem for path in ROOT.glob("*.py")}
    for package in ("teaching", "cryptoroutes"):
        names |= {package if path.stem == "__init__" else package + "." + path.stem
                  for path in (ROOT / package).glob("*.py")}
    return names


@pytest.fixture
def copy(tmp_path):
    """A copy of the project's modules (the root's, cryptoroutes/ and teaching/), to break."""
    copy_runtime(tmp_path)
    shutil.copytree(str(ROOT / "teaching"), str(tmp_path / "teaching"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def append(path, text):
    with open(str(path), "a", encoding="utf-8") as f:
        f.write(text)


def test_the_project_keeps_its_import_rules():
    result = check()
    assert result.returncode == 0, result.stderr
    graph = graph_of(result.stdout)
    assert set(graph) == modules()
    assert {"teaching.demo", "teaching.capture", "tlswire"} <= set(graph)
    runtime = [module for module in graph if not module.startswith("teaching")]
    assert not [(m, d) for m in runtime if m != "obfsproxy" for d in graph[m] if d.startswith("teaching")]
    assert {"teaching.demo", "teaching.capture"} <= set(graph["obfsproxy"])   # lazily, in dispatch
    assert graph["obfs4"] == ["cryptoroutes.curve25519", "obfs4_crypto", "obfs4_drbg", "obfs4_state"]
    assert graph["obfs4_state"] == ["cryptoroutes.curve25519", "obfs4_drbg"]
    assert graph["relay"] == graph["cryptoroutes.pure_aes"] == graph["tlswire"] == []
    assert graph["cryptoroutes.libcrypto"] == graph["cryptoroutes.nettle"] == ["cryptoroutes.syslib"]
    assert graph["webtunnel"] == ["addresses", "browser_tls"] and graph["browser_tls"] == ["tlswire"]
    assert graph["cryptoroutes.aes_ctr"] == ["cryptoroutes.chooser", "cryptoroutes.pure_aes"]
    crypto = [module for module in graph if module.startswith("cryptoroutes")]
    assert all(dep.startswith("cryptoroutes.") for module in crypto for dep in graph[module])
    allowed = {"obfs4_crypto", "obfs4_drbg", "obfs4_state"}
    assert all(dep in allowed or dep.startswith("cryptoroutes.") for leaf in LEAVES for dep in graph[leaf])
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
                                      ("webtunnel", "outbound"), ("tlswire", "obfs2"),
                                      ("obfs4_state", "obfs4")])
def test_a_leaf_importing_the_project_fails(copy, leaf, dep):
    append(copy / ("%s.py" % leaf), "\nimport %s  # noqa\n" % dep)
    leaf = leaf.replace("/", ".")
    result = check(copy)
    assert result.returncode == 1
    assert "%s is a sans-IO leaf but imports %s" % (leaf, dep) in result.stderr


@pytest.mark.parametrize("line", ["import obfs4_drbg", "from obfs4_crypto import SecretBox"])
def test_a_crypto_route_importing_the_transports_fails(copy, line):
    append(copy / "cryptoroutes" / "pure_aes.py", "\n%s  # noqa\n" % line)
    result = check(copy)
    assert result.returncode == 1
    assert "cryptoroutes.pure_aes is a crypto route but imports obfs4_" in result.stderr


@pytest.mark.parametrize("module,dep", [("handshake_scheduler", "listener"), ("handshake_scheduler", "proxy"),
                                        ("process_setup", "listener")])
def test_the_listeners_helpers_importing_what_knows_tunnels_fails(copy, module, dep):
    append(copy / ("%s.py" % module), "\nimport %s  # noqa\n" % dep)
    result = check(copy)
    assert result.returncode == 1
    assert "%s must not know tunnels, but imports %s" % (module, dep) in result.stderr


@pytest.mark.parametrize("line", ["from teaching import present", "import teaching.pcap",
                                  "from teaching.capture import FirstPacket"])
def test_the_runtime_importing_teaching_fails(copy, line):
    append(copy / "transports.py", "\n\ndef later():\n    %s  # noqa\n" % line)
    result = check(copy)
    assert result.returncode == 1
    assert "transports is the runtime but imports teaching." in result.stderr


def test_the_readme_file_table_names_every_module_where_it_is():
    """The README's "How it is built" table: each root module in a runtime row, each
    crypto route in a row of cryptoroutes/, each teaching module in a row of teaching/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## How it is built\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    runtime = " ".join(row.split(" | ")[0] for row in rows if "/" not in row.split(" | ")[0])
    teaching = " ".join(row.split(" | ")[0] for row in rows if "teaching/" in row)
    crypto = " ".join(row.split(" | ")[0] for row in rows if "cryptoroutes/" in row)
    for path in ROOT.glob("*.py"):
        assert "`%s`" % path.name in runtime, path.name
    for path in (ROOT / "cryptoroutes").glob("*.py"):
        if path.stem != "__init__":
            assert "%s`" % path.name in crypto and "`%s`" % path.name not in runtime, path.name
    for path in (ROOT / "teaching").glob("*.py"):
        if path.stem != "__init__":
            assert "%s`" % path.name in teaching and "`%s`" % path.name not in runtime, path.name


def test_the_obfs4_protocol_does_no_file_io():
    """obfs4.py names no file API: the bridge's files are obfs4_state's. Of ``os`` it
    uses the CSPRNG only; no open(), no pathlib, json, shutil or tempfile."""
    tree = ast.parse((ROOT / "obfs4.py").read_text(encoding="utf-8"))
    used_of_os = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                  and isinstance(node.value, ast.Name) and node.value.id == "os"}
    assert used_of_os == {"urandom"}
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == "open"]
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not modules & {"pathlib", "json", "shutil", "tempfile", "io"}
    state = ast.parse((ROOT / "obfs4_state.py").read_text(encoding="utf-8"))
    assert any(isinstance(node, ast.Attribute) and node.attr == "open" for node in ast.walk(state))


def test_the_cli_importing_teaching_at_its_top_fails(copy):
    append(copy / "obfsproxy.py", "\nfrom teaching import demo  # noqa\n")
    result = check(copy)
    assert result.returncode == 1
    assert "obfsproxy imports teaching.demo at its top" in result.stderr


def test_the_root_alone_carries_a_tunnel(tmp_path):
    """The root's *.py and cryptoroutes/ copied without teaching/: every module imports,
    a tunnel carries bytes both ways, and demo, unmask and detect each say in one line
    what is missing."""
    copy_runtime(tmp_path)
    names = sorted(path.stem for path in tmp_path.glob("*.py"))
    imported = subprocess.run([sys.executable, "-c", "import %s" % ", ".join(names)], cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=60)
    assert imported.returncode == 0, imported.stderr
    script = str(tmp_path / "obfsproxy.py")
    assert script != PROGRAM
    with EchoServer() as echo:
        with Program("server", "--transport=obfs2", "--dest=" + fmt(echo.address), "127.0.0.1:0",
                     script=script) as server:
            with Program("client", "--transport=obfs2", "127.0.0.1:0", script=script) as client:
                with socks5_connect(client.address, server.address) as sock:
                    assert echo_round_trip(sock, b"the root alone" * 1000) == b"the root alone" * 1000
    for command in (["demo"], ["unmask", "x.pcap"], ["detect", "x.pcap"]):
        done = subprocess.run([sys.executable, script, *command], cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.count("\n") == 1
        assert done.stderr.startswith("obfsproxy.py %s: the teaching tools are not here" % command[0])
        assert "teaching/ folder" in done.stderr


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


def test_the_benchmarks_import_each_other_without_a_cycle():
    """bench.py and fairness.py imported each other: what one needs of the other
    lives in a module both import (machine, setups)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_imports
    finally:
        sys.path.remove(str(ROOT / "tools"))
    graph = check_imports.build_graph(ROOT / "bench")
    assert "bench" in graph and "fairness" in graph["bench"], graph
    assert check_imports.find_cycle(graph) is None, check_imports.find_cycle(graph)
