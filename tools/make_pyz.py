#!/usr/bin/env python3
"""make_pyz.py: the whole tool as one file, for a machine where nothing can be installed.

    python3 tools/make_pyz.py [OUT]          (default: obfsproxy.pyz in the current folder)
    python3 -I -S obfsproxy.pyz demo         (on the target: any Python 3.8 or newer)

The file is a zip archive Python runs directly (a "zipapp", PEP 441): Python puts the
archive first on ``sys.path`` and runs its ``__main__.py``, which runs ``obfsproxy.py``'s
``main()``. ``-I -S`` keep the target's site-packages and PYTHON* variables out, so what
runs is exactly what is inside. What goes in:

    *.py at the checkout's root         the runtime (client, server, managed) and, while
                                        they live there, the teaching modules
    cryptoroutes/**/*.py                the runtime's crypto routes
    teaching/**/*.py, if present        the teaching modules (demo, unmask, detect)
    docopt                              the command line's parser, copied from the Python
                                        running this script (docopt-ng), with its licence
                                        in LICENSES/; never committed to the project
    LICENSE                             the project's own
    <module>.pyc beside each .py        bytecode of the Python running this script, so
                                        that a target with the same version starts
                                        without compiling; another version ignores it
                                        (a different magic number) and compiles the .py

The crypto needs no package: each primitive chooses its route at import by known
answers (the system's libcrypto, libsodium, nettle or libgcrypt through ctypes, or pure
Python; pycryptodome or PyNaCl only when the target has them and ``-S`` is left off).
The build is reproducible: entries are sorted, their dates fixed, and the bytecode is
hash-checked against its source rather than dated.
"""

import argparse
import importlib.metadata
import importlib.util
import marshal
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHEBANG = b"#!/usr/bin/env python3\n"
DATE = (2020, 1, 1, 0, 0, 0)             # every entry's date: the same bytes from the same tree
LICENCE_NAMES = ("LICENSE", "LICENCE", "COPYING")

MAIN = '''\
"""obfsproxy.pyz: obfsproxy.py as one file (built by tools/make_pyz.py). Run it as
python3 -I -S obfsproxy.pyz --help"""
import sys

import obfsproxy

sys.exit(obfsproxy.main())
'''


class BuildError(Exception):
    """Something the archive needs is missing: one line for the user."""


def project_files(root):
    """{name in the archive: path} for the root's *.py, cryptoroutes/**/*.py and
    teaching/**/*.py."""
    files = {path.name: path for path in sorted(root.glob("*.py"))}
    if "obfsproxy.py" not in files:
        raise BuildError("%s has no obfsproxy.py: run this from a checkout" % root)
    if not (root / "cryptoroutes" / "__init__.py").is_file():
        raise BuildError("%s has no cryptoroutes/ (the crypto routes): run this from a whole checkout" % root)
    for folder in (root / "cryptoroutes", root / "teaching"):
        if folder.is_dir():
            for path in sorted(folder.rglob("*.py")):
                if "__pycache__" not in path.parts:
                    files[path.relative_to(root).as_posix()] = path
    return files


def docopt_files():
    """{name in the archive: bytes} for the docopt this Python imports, and its licence.

    Only a docopt whose distribution ships its licence file is taken (docopt-ng does;
    Debian's python3-docopt keeps its copyright in /usr/share/doc, out of reach)."""
    spec = importlib.util.find_spec("docopt")
    if spec is None or spec.origin is None:
        raise BuildError("this Python (%s) has no docopt: install docopt-ng "
                         "(python3 -m pip install docopt-ng, or .venv/bin/pip install -r "
                         "requirements.txt and run this script with .venv/bin/python3)" % sys.executable)
    origin = Path(spec.origin)
    if spec.submodule_search_locations:            # a package: docopt/*.py
        sources = {"docopt/" + path.name: path for path in sorted(origin.parent.glob("*.py"))}
    else:                                          # one module: docopt.py
        sources = {"docopt.py": origin}
    files = {name: path.read_bytes() for name, path in sources.items()}
    dist, licence = docopt_distribution(origin)
    if licence is None:
        raise BuildError("the docopt at %s (%s) ships no licence file to include: install docopt-ng "
                         "(python3 -m pip install docopt-ng) in the Python that builds" % (origin, dist))
    files["LICENSES/%s-%s.txt" % (dist, licence.name)] = licence.read_bytes()
    return files


def docopt_distribution(origin):
    """(distribution name, its licence file or None) of the installed docopt at ``origin``."""
    for dist in importlib.metadata.distributions():
        files = [f for f in dist.files or () if str(f) == "docopt.py" or str(f).startswith("docopt/")
                 or ".dist-info/" in str(f) or ".egg-info/" in str(f)]
        if not any(str(f).startswith("docopt") for f in files):
            continue                      # another package: not worth resolving its files
        located = [Path(dist.locate_file(f)).resolve() for f in files]
        if origin.resolve() not in located:
            continue
        licences = [path for path in located
                    if path.name.upper().startswith(LICENCE_NAMES) and path.is_file()]
        return "%s-%s" % (dist.metadata["Name"], dist.version), (licences[0] if licences else None)
    return "not from a distribution", None


def bytecode(source, name):
    """A .pyc for ``source``, checked against the source's hash (PEP 552), not its date."""
    code = compile(source, name, "exec", dont_inherit=True)
    flags = 0b11                                   # hash-based, check the source
    return (importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little")
            + importlib.util.source_hash(source) + marshal.dumps(code))


def entry(archive, name, data):
    info = zipfile.ZipInfo(name, DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    archive.writestr(info, data)


def build(out, root=ROOT):
    """Write the archive to ``out``; returns {name: bytes} of what went in."""
    contents = {name: path.read_bytes() for name, path in project_files(root).items()}
    contents.update(docopt_files())
    contents["__main__.py"] = MAIN.encode()
    contents["LICENSE"] = (root / "LICENSE").read_bytes()
    for name in [name for name in contents if name.endswith(".py")]:
        contents[name[:-3] + ".pyc"] = bytecode(contents[name], name)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with partial.open("wb") as handle:
        handle.write(SHEBANG)
        with zipfile.ZipFile(handle, "w") as archive:
            for name in sorted(contents):
                entry(archive, name, contents[name])
    partial.chmod(0o755)
    partial.replace(out)
    return contents


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build obfsproxy.pyz, the tool as one file.")
    parser.add_argument("out", nargs="?", default="obfsproxy.pyz",
                        help="where to write it (default: obfsproxy.pyz)")
    args = parser.parse_args(argv)
    try:
        contents = build(args.out)
    except (BuildError, OSError) as exc:
        print("make_pyz.py: %s" % exc, file=sys.stderr)
        return 1
    modules = sum(1 for name in contents if name.endswith(".py"))
    size = Path(args.out).stat().st_size
    print("%s: %d modules, %d bytes, bytecode for Python %d.%d; run it with: python3 -I -S %s --help"
          % (args.out, modules, size, sys.version_info[0], sys.version_info[1], args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
