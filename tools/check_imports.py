#!/usr/bin/env python3
"""check_imports.py: the project's import graph, and the rules it must keep.

Reads every ``*.py`` of the project's root (the runtime), of ``cryptoroutes/`` (the
runtime's crypto routes, named ``cryptoroutes.chooser`` and so on) and of ``teaching/``
(the teaching tools, named ``teaching.demo`` and so on) with ``ast`` (nothing is imported or
run), keeps the imports that name one of the project's own modules, wherever they stand
(a lazy import inside a function is an edge too), prints the graph one ``module -> deps``
line per module, and checks six rules::

    1. no cycle                    a -> b -> a would make the layers meaningless
    2. nobody imports obfsproxy    the CLI is the top; nothing may depend on it
    3. the leaves import           obfs2, obfs3, obfs4, its primitives and its state,
       nothing of ours             socks, webtunnel, browser_tls, tlswire and the relay,
                                   except obfs4 -> its pieces, the transports ->
                                   the crypto routes they use, and webtunnel ->
                                   browser_tls -> tlswire (LEAF_ALLOWED); a
                                   leaf that imported proxy would drag sockets
                                   and threads into the protocol, a relay that
                                   imported the listener would know tunnels
    4. the standard library only   relay and webtunnel import nothing outside it
                                   (checked where Python names its standard
                                   library: 3.10 and newer)
    5. the runtime never imports   the root's *.py carry a tunnel alone, so a machine
       teaching                    that only serves traffic takes the root alone; the
                                   CLI reaches demo, unmask and detect inside a
                                   function, only when one of them runs
    6. the crypto routes import    cryptoroutes/ is a layer below the transports:
       nothing of ours outside     it knows no protocol, so any transport may
       cryptoroutes/               use it
    7. the scheduler knows no      handshake_scheduler imports only outbound (for a
       tunnel                      thread's own poll), process_setup only proxy (its
                                   logger): turns, waits and process limits stay
                                   apart from the listener that uses them

Exit status 0 when all hold, 1 (with one line per violation on stderr) when
one does not or a file does not parse.

Usage: ``python3 tools/check_imports.py [PROJECT_DIR]`` (default: the folder
above this script). The tests run it on a copy with a rule broken, to show
that it can fail.
"""

import ast
import sys
from pathlib import Path

CLI = "obfsproxy"
TEACHING = "teaching"
CRYPTO = "cryptoroutes"
PACKAGES = (TEACHING, CRYPTO)           # folders whose modules are named package.module
LEAVES = ("obfs2", "obfs3", "obfs4", "obfs4_state", "obfs4_crypto", "obfs4_drbg", "socks", "webtunnel",
          "browser_tls", "tlswire", "addresses", "relay")
# obfs4 and its primitives: the frame cipher (and the route report), the DRBG, the keys,
# the bridge's identity and its files (obfs4_state: the only file I/O among the leaves,
# which obfs4's server_config reaches once per listener; it never imports the protocol,
# so the protocol can import it); and the crypto routes (cryptoroutes/: obfs2 and obfs3
# use its AES-CTR, obfs3 its modular power, obfs4 its curve and Salsa20 routes), which
# import nothing of ours outside their folder (CRYPTO_ALLOWED says inside it).
LEAF_ALLOWED = {("obfs4", "obfs4_crypto"), ("obfs4", "obfs4_drbg"), ("obfs4", "cryptoroutes.curve25519"),
                ("obfs4", "obfs4_state"), ("obfs4_state", "cryptoroutes.curve25519"),
                ("obfs4_state", "obfs4_drbg"), ("obfs4_crypto", "obfs4_drbg"),
                ("obfs4_crypto", "cryptoroutes.chooser"), ("obfs4_crypto", "cryptoroutes.curve25519"),
                ("obfs4_crypto", "cryptoroutes.pure_salsa20"), ("obfs4_crypto", "cryptoroutes.framebox"),
                ("obfs4_drbg", "cryptoroutes.chooser"),
                ("obfs2", "cryptoroutes.aes_ctr"), ("obfs3", "cryptoroutes.aes_ctr"),
                ("obfs3", "cryptoroutes.chooser"),
                # webtunnel: addr= read as every address is; its client's browser hello (curl
                # behind a socketpair), checked by its JA4 at start-up
                ("webtunnel", "addresses"), ("webtunnel", "browser_tls"), ("browser_tls", "tlswire")}
STDLIB_ONLY = ("relay", "webtunnel")
# What the listener's helpers may import of ours (rule 6): none of them knows tunnels.
ONLY = {"handshake_scheduler": {"outbound"}, "process_setup": {"proxy"}}
STDLIB = getattr(sys, "stdlib_module_names", None)


def imports(tree):
    """{name: lazy} for every absolute import in ``tree``: the module named (``teaching.pcap``
    for ``from teaching import pcap`` or ``from teaching.pcap import load``, else the
    top-level name) and whether every import of it stands inside a function."""
    inside = {id(node) for function in ast.walk(tree)
              if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(function) if node is not function}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module in PACKAGES:
                names = ["%s.%s" % (node.module, alias.name) for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            name = ".".join(parts[:2]) if parts[0] in PACKAGES else parts[0]
            found[name] = found.get(name, True) and id(node) in inside
    return found


def sources(folder):
    """{module: path}: the root's *.py by name, teaching/*.py as teaching.<name>,
    cryptoroutes/*.py as cryptoroutes.<name>."""
    folder = Path(folder)
    paths = {path.stem: path for path in sorted(folder.glob("*.py"))}
    for package in PACKAGES:
        for path in sorted((folder / package).glob("*.py")):
            paths[package if path.stem == "__init__" else "%s.%s" % (package, path.stem)] = path
    return paths


def build_graph(folder, outside=None, lazy=None):
    """{module: sorted list of the project modules it imports}. SyntaxError
    (with the file name) when a file does not parse. ``outside``, if given, is
    filled with {module: the names it imports that are not the project's};
    ``lazy`` with {module: the project modules it imports only inside functions}."""
    paths = sources(folder)
    graph = {}
    for module, path in paths.items():
        source = path.read_text(encoding="utf-8")
        found = imports(ast.parse(source, filename=str(path)))
        names = set(found)
        graph[module] = sorted((names & set(paths)) - {module})
        if outside is not None:
            outside[module] = sorted(names - set(paths))
        if lazy is not None:
            lazy[module] = sorted(name for name in graph[module] if found[name])
    return graph


def is_teaching(module):
    return module == TEACHING or module.startswith(TEACHING + ".")


def is_crypto(module):
    return module == CRYPTO or module.startswith(CRYPTO + ".")


def find_cycle(graph):
    """One cycle as a list [a, b, ..., a], or None. Depth-first search with
    three colours: a grey node reached again closes a cycle."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    path = []

    def visit(module):
        colour[module] = GREY
        path.append(module)
        for dep in graph[module]:
            if colour[dep] == GREY:
                return path[path.index(dep):] + [dep]
            if colour[dep] == WHITE:
                cycle = visit(dep)
                if cycle:
                    return cycle
        path.pop()
        colour[module] = BLACK
        return None

    for module in sorted(graph):
        if colour[module] == WHITE:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def violations(graph, outside=None, lazy=None):
    """Every broken rule, one sentence each."""
    problems = []
    for module, deps in sorted(graph.items()):
        if is_teaching(module):
            continue
        for dep in filter(is_teaching, deps):
            if module != CLI:
                problems.append("%s is the runtime but imports %s (the root must serve traffic "
                                "without teaching/)" % (module, dep))
            elif lazy is not None and dep not in lazy.get(module, ()):
                problems.append("%s imports %s at its top (import it inside the function that "
                                "needs it, so the root runs without teaching/)" % (module, dep))
    for module in STDLIB_ONLY:
        if STDLIB is not None and outside and module in outside:
            for name in outside[module]:
                if name not in STDLIB:
                    problems.append("%s may use the standard library only, but imports %s"
                                    % (module, name))
    cycle = find_cycle(graph)
    if cycle:
        problems.append("import cycle: %s" % " -> ".join(cycle))
    for module, deps in sorted(graph.items()):
        if CLI in deps:
            problems.append("%s imports %s, the command line (nothing may)" % (module, CLI))
        if module in LEAVES:
            for dep in deps:
                if (module, dep) not in LEAF_ALLOWED:
                    problems.append("%s is a sans-IO leaf but imports %s" % (module, dep))
        if is_crypto(module):
            for dep in deps:
                if not is_crypto(dep):
                    problems.append("%s is a crypto route but imports %s (the crypto routes "
                                    "import nothing of ours outside %s/)" % (module, dep, CRYPTO))
        for dep in sorted(set(deps) - ONLY.get(module, set(deps))):
            problems.append("%s must not know tunnels, but imports %s" % (module, dep))
    return problems


def main(argv):
    folder = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    outside, lazy = {}, {}
    try:
        graph = build_graph(folder, outside, lazy)
    except SyntaxError as error:
        print("check_imports: cannot parse %s: %s" % (error.filename, error.msg), file=sys.stderr)
        return 1
    if not graph:
        print("check_imports: no *.py files in %s" % folder, file=sys.stderr)
        return 1
    for module, deps in sorted(graph.items()):
        print("%s -> %s" % (module, ", ".join(deps) if deps else "(nothing of ours)"))
    problems = violations(graph, outside, lazy)
    for problem in problems:
        print("check_imports: %s" % problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
