#!/usr/bin/env python3
"""make_pyz.py: the whole tool as one file, for a machine where nothing can be installed.

    python3 tools/make_pyz.py [--docopt=PATH] [OUT]   (default OUT: obfsproxy.pyz here)
    python3 -I -S obfsproxy.pyz demo                  (on the target: Python 3.6 or newer)

The build needs Python 3.8 or newer (it reads the installed docopt's metadata); the
file it makes runs on Python 3.6 or newer, unless the docopt it carries needs more
(docopt-ng 0.8 and newer need 3.7: the build says so, and the file says so in one line
on an older Python). For a file that also runs on 3.6, give ``--docopt`` classic
docopt 0.6.2, e.g. Debian's python3-docopt (/usr/lib/python3/dist-packages/docopt.py).

The file is a zip archive Python runs directly (a "zipapp", PEP 441): Python puts the
archive first on ``sys.path`` and runs its ``__main__.py``, which runs ``obfsproxy.py``'s
``main()``. ``-I -S`` keep the target's site-packages and PYTHON* variables out, so what
runs is exactly what is inside. What goes in:

    *.py at the checkout's root         the runtime (client, server, managed) and, while
                                        they live there, the teaching modules
    cryptoroutes/**/*.py                the runtime's crypto routes
    teaching/**/*.py, if present        the teaching modules (demo, unmask, detect)
    docopt                              the command line's parser, copied from the Python
                                        running this script (docopt-ng, or Debian's
                                        python3-docopt) or from --docopt, with its licence
                                        in LICENSES/; never committed to the project
    docs/PROTOCOL.md, README.md         the guide and the README, which the file's
                                        ``guide`` command prints or writes out
    LICENSE                             the project's own
    <module>.pyc beside each .py        bytecode of the Python running this script, so
                                        that a target with the same version starts
                                        without compiling; another version ignores it
                                        (a different magic number) and compiles the .py
    bytecode/<cache tag>/*.pyc          with --bytecode-for PYTHON: the same, compiled by
                                        that Python (e.g. cpython-36), which __main__.py
                                        imports from on that Python: without it, 3.6
                                        takes ~2.4 times 3.11's start-up, compiling

The crypto needs no package: each primitive chooses its route at import by known
answers (the system's libcrypto, libsodium, nettle or libgcrypt through ctypes, or pure
Python; pycryptodome or PyNaCl only when the target has them and ``-S`` is left off).
The build is reproducible: entries are sorted, their dates fixed, and the bytecode is
hash-checked against its source rather than dated.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import marshal
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHEBANG = b"#!/usr/bin/env python3\n"
DATE = (2020, 1, 1, 0, 0, 0)             # every entry's date: the same bytes from the same tree
LICENCE_NAMES = ("LICENSE", "LICENCE", "COPYING")
FLOOR = (3, 6)                           # the oldest Python the project's own code runs on
DOCS = ("docs/PROTOCOL.md", "README.md")  # travel inside: ``obfsproxy.pyz guide`` shows them

# Python 2 parses this too, so that any old Python gets the one line before anything else.
MAIN = '''\
"""obfsproxy.pyz: obfsproxy.py as one file (built by tools/make_pyz.py). Run it as
python3 -I -S obfsproxy.pyz --help"""
import sys

if sys.version_info < %(floor)r:
    sys.exit("obfsproxy.pyz needs Python %(floor_text)s or newer%(why)s; this is Python %%s (%%s)"
             %% (sys.version.split()[0], sys.executable))

'''

# The rest of __main__.py: no formatting, so written as it runs (and Python 2 parses it).
MAIN_BODY = '''

def use_bytecode_for_this_python():
    """Import the archive's modules from bytecode/<this Python's cache tag>/ when the
    build compiled them for this Python (make_pyz.py --bytecode-for): zipimport uses only
    the NAME.pyc beside each NAME.py, which serves the Python that built the archive,
    and any other Python compiles every module again at every start."""
    import importlib.machinery
    import importlib.util
    import marshal
    import os
    import zipfile
    import zipimport

    archive = os.path.dirname(os.path.abspath(__file__))
    folder = "bytecode/%s/" % sys.implementation.cache_tag
    try:
        files = zipfile.ZipFile(archive)
        if files.read(folder + "MAGIC") != importlib.util.MAGIC_NUMBER:
            return
    except (OSError, KeyError, zipfile.BadZipFile):
        return
    compiled = set(name[len(folder):-4] for name in files.namelist()
                   if name.startswith(folder) and name.endswith(".pyc"))
    plain = zipimport.zipimporter(archive)

    class Loader(object):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            key = module.__spec__.loader_state
            exec(marshal.loads(files.read(folder + key + ".pyc")), module.__dict__)

        def get_data(self, path):
            return plain.get_data(path)

    loader = Loader()

    class Finder(object):
        @staticmethod
        def find_spec(name, path=None, target=None):
            key = name.replace(".", "/")
            package = key + "/__init__" in compiled
            if package:
                key += "/__init__"
            elif key not in compiled:
                return None
            spec = importlib.machinery.ModuleSpec(name, loader, origin=os.path.join(archive, key + ".py"),
                                                  loader_state=key, is_package=package)
            if package:
                spec.submodule_search_locations = [os.path.join(archive, key[:-len("/__init__")])]
            spec.has_location = True
            return spec

    sys.meta_path.insert(0, Finder)


use_bytecode_for_this_python()

import obfsproxy  # noqa: E402

sys.exit(obfsproxy.main())
'''

# Run by each --bytecode-for Python (3.6 and newer): reads {name: source} as JSON on stdin,
# writes marshal({"tag", "magic", "codes": {name: marshalled code}}) on stdout.
COMPILER = '''
import importlib.util, json, marshal, sys
sources = json.loads(sys.stdin.read())
codes = dict((name, marshal.dumps(compile(text, name, "exec", dont_inherit=True)))
             for name, text in sorted(sources.items()))
sys.stdout.buffer.write(marshal.dumps({"tag": sys.implementation.cache_tag,
                                       "magic": importlib.util.MAGIC_NUMBER, "codes": codes}))
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


INSTALL_DOCOPT = ("install docopt-ng where the build runs: in a virtual environment (python3 -m venv "
                  ".venv && .venv/bin/pip install -r requirements.txt, then run this script with "
                  ".venv/bin/python3), or on Debian and Ubuntu apt-get install python3-docopt")


def docopt_files(path=None):
    """({name in the archive: bytes}, the oldest Python it runs on, its name) for the
    docopt at ``path`` (a docopt.py, or a docopt/ package folder), by default the one
    this Python imports, with its licence.

    Only a docopt whose licence comes with it is taken: docopt-ng's distribution ships
    its licence file; Debian's python3-docopt keeps its in the package's copyright file,
    which ``dpkg-query`` finds."""
    if path is None:
        spec = importlib.util.find_spec("docopt")
        if spec is None or spec.origin is None:
            raise BuildError("this Python (%s) has no docopt: %s" % (sys.executable, INSTALL_DOCOPT))
        origin = Path(spec.origin)
    else:
        origin = Path(path).resolve()
        if origin.is_dir():
            origin = origin / "__init__.py"
        if origin.name not in ("docopt.py", "__init__.py") or not origin.is_file():
            raise BuildError("--docopt %s: give a docopt.py file or a docopt/ folder" % path)
    if origin.name == "__init__.py":               # a package: docopt/*.py
        sources = {"docopt/" + path.name: path for path in sorted(origin.parent.glob("*.py"))}
    else:                                          # one module: docopt.py
        sources = {"docopt.py": origin}
    files = {name: path.read_bytes() for name, path in sources.items()}
    dist, licence, requires = docopt_distribution(origin)
    if licence is None:
        dist, licence = debian_copyright(origin) or (dist, None)
    if licence is None:
        raise BuildError("the docopt at %s (%s) ships no licence file to include: %s"
                         % (origin, dist, INSTALL_DOCOPT))
    files["LICENSES/%s-%s.txt" % (dist, licence.name)] = licence.read_bytes()
    floor = max(FLOOR, python_floor(requires, files))
    return files, floor, dist


def python_floor(requires, files):
    """The oldest Python a docopt runs on: its distribution's Requires-Python (">=3.7"),
    or 3.7 for code that needs it (postponed annotations), else the project's floor."""
    found = re.search(r">=\s*3\.(\d+)", requires or "")
    if found:
        return (3, int(found.group(1)))
    if any(b"from __future__ import annotations" in data for data in files.values()):
        return (3, 7)
    return FLOOR


def debian_copyright(origin):
    """(package-version, its copyright file) when a Debian package installed ``origin``."""
    try:
        owner = subprocess.run(["dpkg-query", "-S", str(origin.resolve())], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    package = owner.stdout.partition(":")[0].strip()
    copyright_file = Path("/usr/share/doc") / package / "copyright"
    if owner.returncode != 0 or not package or not copyright_file.is_file():
        return None
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30).stdout
    return "%s-%s" % (package, version.strip() or "unknown"), copyright_file


def docopt_distribution(origin):
    """(distribution name, its licence file or None, its Requires-Python or None) of the
    installed docopt at ``origin``."""
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
        return ("%s-%s" % (dist.metadata["Name"], dist.version), (licences[0] if licences else None),
                dist.metadata["Requires-Python"])
    return "not from a distribution", None, None


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


def bytecode_of(python, sources):
    """{name in the archive: bytes} of ``sources`` compiled by another Python (a path
    or a command name), in bytecode/<its cache tag>/, which __main__.py loads from on
    that Python; nothing for the Python running this script (NAME.pyc serves it)."""
    try:
        done = subprocess.run([python, "-I", "-S", "-c", COMPILER], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=300,
                              input=json.dumps({n: s.decode("utf-8") for n, s in sources.items()}).encode())
    except OSError as exc:
        raise BuildError("--bytecode-for %s: %s" % (python, exc.strerror or exc))
    if done.returncode != 0:
        raise BuildError("--bytecode-for %s: %s" % (python, (done.stderr.decode(errors="replace").strip()
                                                              .splitlines() or ["failed"])[-1]))
    made = marshal.loads(done.stdout)
    if made["magic"] == importlib.util.MAGIC_NUMBER:
        return {}
    folder = "bytecode/%s/" % made["tag"]
    files = {folder + "MAGIC": made["magic"]}
    files.update({folder + name[:-3] + ".pyc": code for name, code in made["codes"].items()})
    return files


def build(out, root=ROOT, docopt=None, bytecode_for=()):
    """Write the archive to ``out``, with the docopt at ``docopt`` (default: this
    Python's) and bytecode for each Python in ``bytecode_for``; returns ({name: bytes}
    of what went in, the oldest Python it runs on, and the docopt's name)."""
    contents = {name: path.read_bytes() for name, path in project_files(root).items()}
    parser, floor, parser_name = docopt_files(docopt)
    contents.update(parser)
    why = "" if floor == FLOOR else " (its %s does)" % parser_name
    contents["__main__.py"] = (MAIN % {"floor": floor, "floor_text": "%d.%d" % floor, "why": why}
                               + MAIN_BODY).encode()
    contents["LICENSE"] = (root / "LICENSE").read_bytes()
    for name in DOCS:
        if (root / name).is_file():
            contents[name] = (root / name).read_bytes()
    sources = {name: contents[name] for name in contents if name.endswith(".py")}
    for name in sources:
        contents[name[:-3] + ".pyc"] = bytecode(contents[name], name)
    del sources["__main__.py"]                     # runpy runs it, through zipimport
    for python in bytecode_for or ():
        contents.update(bytecode_of(python, sources))
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
    return contents, floor, parser_name


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build obfsproxy.pyz, the tool as one file.")
    parser.add_argument("out", nargs="?", default="obfsproxy.pyz",
                        help="where to write it (default: obfsproxy.pyz)")
    parser.add_argument("--docopt", metavar="PATH",
                        help="the docopt to put inside (a docopt.py or a docopt/ folder; default: "
                             "this Python's). Classic docopt 0.6.2, e.g. Debian's "
                             "/usr/lib/python3/dist-packages/docopt.py, makes a file for Python 3.6")
    parser.add_argument("--bytecode-for", metavar="PYTHON", action="append", default=[],
                        help="also compile the modules with PYTHON (a path; repeat for more), so "
                             "that the file starts as fast there as on the Python that builds it")
    args = parser.parse_args(argv)
    try:
        contents, floor, parser_name = build(args.out, docopt=args.docopt, bytecode_for=args.bytecode_for)
    except (BuildError, OSError) as exc:
        print("make_pyz.py: %s" % exc, file=sys.stderr)
        return 1
    modules = sum(1 for name in contents if name.endswith(".py"))
    size = Path(args.out).stat().st_size
    print("%s: %d modules, %d bytes, bytecode for Python %d.%d, runs on Python %d.%d or newer; "
          "run it with: python3 -I -S %s --help"
          % (args.out, modules, size, sys.version_info[0], sys.version_info[1], floor[0], floor[1], args.out))
    if floor > FLOOR:
        print("(%s needs Python %d.%d; for a file that also runs on %d.%d, build with "
              "--docopt=/usr/lib/python3/dist-packages/docopt.py, Debian's python3-docopt 0.6.2)"
              % (parser_name, floor[0], floor[1], FLOOR[0], FLOOR[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
