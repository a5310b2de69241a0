"""cryptoroutes/syslib.py: finding a system library for ``ctypes``, and handing it buffers.

The system crypto libraries (libsodium, nettle, libgcrypt) are never required: each is
looked for under the names its platform gives it, then through
``ctypes.util.find_library``, and a library that is missing, will not load, or lacks
a function is simply not a route (chooser.py says why in the route report).

Names are tried versioned first (``libsodium.so.23``): the soname is the ABI the
bindings were written for. ``find_library`` comes last, because it may run
``ldconfig`` or a compiler to look (tens of milliseconds) and may name a development
symlink. On macOS an unversioned system library is never opened: ``dlopen`` of
``/usr/lib/libcrypto.dylib`` and its kind aborts the process (Apple ships them as
stubs that refuse to load), and nothing can catch an abort.

Buffers: every route takes ``bytes``, ``bytearray``, ``memoryview`` and other buffers.
Their length is their length in **bytes**: a memoryview whose items are not bytes (a
``.cast("I")``, an ``array("I")``) is read as its bytes (``nbytes``), never as its item
count, which would cover only part of it.
"""

import ctypes
import ctypes.util
import os
import sys

_c_char = ctypes.c_char

# family -> {platform prefix: names to try, best first}; then find_library(FIND[family])
NAMES = {
    "libsodium": {"linux": ["libsodium.so.26", "libsodium.so.23"],
                  "darwin": ["libsodium.26.dylib", "libsodium.23.dylib",
                             "/opt/homebrew/lib/libsodium.26.dylib", "/opt/homebrew/lib/libsodium.23.dylib",
                             "/usr/local/lib/libsodium.26.dylib", "/usr/local/lib/libsodium.23.dylib"],
                  "win32": ["libsodium.dll", "libsodium-26.dll", "libsodium-23.dll"],
                  "": ["libsodium.so.26", "libsodium.so.23"]},
    "nettle": {"linux": ["libnettle.so.8", "libnettle.so.7", "libnettle.so.6"],
               "darwin": ["libnettle.8.dylib", "/opt/homebrew/lib/libnettle.8.dylib",
                          "/usr/local/lib/libnettle.8.dylib"],
               "win32": ["libnettle-8.dll", "nettle-8.dll"],
               "": ["libnettle.so.8", "libnettle.so.7", "libnettle.so.6"]},
    "libgcrypt": {"linux": ["libgcrypt.so.20"],
                  "darwin": ["libgcrypt.20.dylib", "/opt/homebrew/lib/libgcrypt.20.dylib",
                             "/usr/local/lib/libgcrypt.20.dylib"],
                  "win32": ["libgcrypt-20.dll"],
                  "": ["libgcrypt.so.20"]},
}
FIND = {"libsodium": "sodium", "nettle": "nettle", "libgcrypt": "gcrypt"}


def platform_names(family, platform=sys.platform):
    """The file names ``family`` goes by on ``platform``, best first."""
    names = NAMES[family]
    for prefix in ("linux", "darwin", "win32"):
        if platform.startswith(prefix):
            return list(names[prefix])
    return list(names[""])


def is_unversioned_dylib(path):
    """True for a macOS library name with no version in it (``libcrypto.dylib``), which
    this module never opens on macOS (see the module docstring)."""
    name = os.path.basename(path)
    return name.endswith(".dylib") and not any(char.isdigit() for char in name)


def candidates(family, platform=sys.platform, find_library=ctypes.util.find_library):
    """Every file name to try for ``family``, best first, without the unversioned macOS ones."""
    names = platform_names(family, platform)
    try:
        found = find_library(FIND[family])
    except Exception:  # find_library runs outside tools; a failure there is a library not found
        found = None
    if found:
        names.append(found)
    if platform == "darwin":
        names = [name for name in names if not is_unversioned_dylib(name)]
    return list(dict.fromkeys(names))


def load(family, has, platform=sys.platform, find_library=ctypes.util.find_library, loader=ctypes.CDLL):
    """(ctypes library, file name, None) for the first candidate of ``family`` that
    loads and has the function named ``has``, or (None, None, why not)."""
    why = "%s not found" % family
    for name in candidates(family, platform, find_library):
        try:
            lib = loader(name)
        except OSError:
            continue
        if getattr(lib, has, None) is None:
            why = "%s (%s) lacks %s" % (family, name, has)
            continue
        return lib, name, None
    return None, None, why


def bind(lib, name, restype, *argtypes):
    """lib.name with its C signature, or None when the library lacks it."""
    function = getattr(lib, name, None)
    if function is not None:
        function.restype, function.argtypes = restype, argtypes
    return function


def bind_own(lib, name, restype, *argtypes):
    """A function object of its own for lib.name, with this C signature, or None when
    the library lacks it. ``lib.name`` is one object shared by every binding of the
    library; the routes that pass addresses (ints, see ``buffer_with_address``) where
    another binding passes bytes need ``c_void_p`` arguments of their own."""
    try:
        function = lib[name]
    except AttributeError:
        return None
    function.restype, function.argtypes = restype, argtypes
    return function


def buffer_with_address(size):
    """(a bytearray of ``size`` zero bytes, a memoryview of it, its address): a buffer
    that C writes at the address and Python fills and copies out by slices of the view,
    with no conversion per call. The view pins the bytearray (it cannot be resized
    while the view exists), so the address stays valid as long as the view is kept."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    return buffer, view, ctypes.addressof((_c_char * size).from_buffer(buffer))


def readable(data):
    """(an argument C can read ``data`` from, its length in bytes). ``bytes`` as it is;
    a writable buffer without a copy; anything else (a read-only memoryview) copied
    once. Items that are not bytes count by their bytes (module docstring)."""
    if type(data) is bytes:
        return data, len(data)
    view = memoryview(data)
    size = view.nbytes
    if view.readonly:
        return view.tobytes(), size
    if not view.c_contiguous:
        return view.tobytes(), size
    return (_c_char * size).from_buffer(view.cast("B") if view.format not in ("B", "b", "c") or
                                        view.ndim != 1 else view), size


def byte_length(data):
    """len(data) in bytes (module docstring)."""
    return len(data) if type(data) is bytes else memoryview(data).nbytes


def as_bytes_view(data):
    """``data`` itself when it is bytes, else a memoryview of it whose items are
    bytes, so that len() and slices count bytes (module docstring)."""
    if type(data) is bytes:
        return data
    view = memoryview(data)
    if view.ndim == 1 and view.format in ("B", "b", "c"):
        return view
    return view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
