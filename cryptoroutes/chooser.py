"""cryptoroutes/chooser.py: the crypto libraries we may use, and how each crypto route is chosen.

Every primitive the transports run has candidate routes, fastest first, from these
families: libsodium through PyNaCl; pycryptodome's C code (its ``Crypto`` namespace
from pip, or ``Cryptodome`` from Debian's python3-pycryptodome: the same code); the
system's own libraries through ``ctypes``, with no package: OpenSSL's libcrypto, the one
Python's own ``ssl`` runs (libcrypto.py), libsodium (libsodium.py), nettle (nettle.py)
and libgcrypt (libgcrypt.py), each found by its platform's names (syslib.py) and never
required; and plain Python (pure_aes.py, pure_salsa20.py and the pure functions of each
module). Where a system route measured faster than a package's, it comes first,
whatever is installed. A candidate is used only if it gives every known answer (copied
from ``shared/vectors``; the tests check the copies) when its module is imported; one
that is missing, raises, or answers wrongly is skipped for the next. The last
candidate, the plain-Python function, is the fallback (the tests prove it on the same
vectors), so an upgrade of any library can make us slower, never wrong. ``choose`` does
this; ``PASSED_OVER`` remembers which routes failed, and ``unavailable()`` why a family
is not used at all, for the route report.

``OBFSPROXY_CRYPTO`` in the environment picks the families (``MODES``):

=============  =======================================================================
(unset), auto  every family that loads
portable       pycryptodome and libcrypto only: leave out PyNaCl, as if it were not
               installed, and the other system libraries (the pycryptodome routes)
stdlib         leave out PyNaCl and pycryptodome: no Python package, only what Python
               reaches alone (the system's libraries through ctypes, then plain
               Python), as on a machine where nothing can be installed
python         plain Python only: no package and no system library
=============  =======================================================================

``OBFSPROXY_CRYPTO_SKIP`` leaves out the families it names, comma-separated, whatever
the mode: ``pynacl``, ``pycryptodome``, ``libcrypto``, ``libsodium``, ``nettle``,
``libgcrypt`` (e.g. ``OBFSPROXY_CRYPTO_SKIP=libsodium,nettle``: Salsa20 then runs on
libgcrypt), for an operator who distrusts a library, and for the tests. The tests, CI
and the benchmark use both to run each route on a machine that has every library. Any
other value of either is an error: a typo must not silently pick a route. Importing
this module never fails for it (obfsproxy.py imports it before it can report errors);
the first import of a route module (aes_ctr.py, curve25519.py, ...) raises
``CryptoSettingError``, which obfsproxy.py reports in one line, and to Tor as ENV-ERROR.

We call pycryptodome and PyNaCl only through their public functions: no underscored
names, no cffi handles. (Calling pycryptodome's ``_raw_api`` C handles directly saved
~3.5 µs per frame, but a private route can change its meaning in any release.) The one
lightly documented name is ``Poly1305.Poly1305_MAC`` (a raw-key Poly1305), used only
after its known answers. The system libraries are called only through their public,
documented APIs.
"""

import importlib
import os
import re
import sys

CRYPTO_ENV = "OBFSPROXY_CRYPTO"
SKIP_ENV = "OBFSPROXY_CRYPTO_SKIP"
PACKAGES = ("PyNaCl", "pycryptodome")
SYSTEM_LIBRARIES = ("libcrypto", "libsodium", "nettle", "libgcrypt")
FAMILIES = PACKAGES + SYSTEM_LIBRARIES
# value -> the families it lets in
MODES = {"auto": FAMILIES, "portable": ("pycryptodome", "libcrypto"), "stdlib": SYSTEM_LIBRARIES,
         "python": ()}


class KnownAnswerError(RuntimeError):
    """The crypto routes cannot run as asked: a primitive with no fallback gave a wrong
    known answer at import, or (``CryptoSettingError``) OBFSPROXY_CRYPTO names no
    family. obfsproxy.py says it in one line, and to Tor as ENV-ERROR."""


class CryptoSettingError(KnownAnswerError, ValueError):
    """OBFSPROXY_CRYPTO has a value that is not in ``MODES``."""


def crypto_mode(environ):
    """"auto", "portable", "stdlib" or "python" from OBFSPROXY_CRYPTO (unset or empty:
    "auto"); CryptoSettingError, in one line that names the values, for any other."""
    value = environ.get(CRYPTO_ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise CryptoSettingError(
            "%s=%r is not a crypto route setting: use 'auto' (the default: the fastest route that "
            "gives the known answers), 'portable' (pycryptodome and libcrypto only), 'stdlib' (no "
            "package: the system's libraries through ctypes, then plain Python) or 'python' (plain "
            "Python only)"
            % (CRYPTO_ENV, environ[CRYPTO_ENV]))
    return value


def skipped_families(environ):
    """The families OBFSPROXY_CRYPTO_SKIP names (a comma-separated list, any case), by
    their names in FAMILIES; CryptoSettingError, in one line, for a name that is none."""
    by_lower = {family.lower(): family for family in FAMILIES}
    names = [name.strip().lower() for name in environ.get(SKIP_ENV, "").split(",") if name.strip()]
    wrong = [name for name in names if name not in by_lower]
    if wrong:
        raise CryptoSettingError("%s=%r names no crypto library (%s): use a comma-separated list of %s"
                                 % (SKIP_ENV, environ[SKIP_ENV], ", ".join(wrong),
                                    ", ".join(sorted(by_lower))))
    return tuple(family for family in FAMILIES if family.lower() in names)


def families(environ):
    """{family: None if it may be used, else why not} under OBFSPROXY_CRYPTO and
    OBFSPROXY_CRYPTO_SKIP; CryptoSettingError for a bad value of either."""
    mode, skipped = crypto_mode(environ), skipped_families(environ)
    return {family: ("%s=%s" % (CRYPTO_ENV, mode) if family not in MODES[mode] else
                     "left out by %s" % SKIP_ENV if family in skipped else None) for family in FAMILIES}


def use_nacl(environ):
    """True if OBFSPROXY_CRYPTO and OBFSPROXY_CRYPTO_SKIP let PyNaCl be used."""
    return families(environ)["PyNaCl"] is None


def site_packages_off():
    """True when this Python looks in no site-packages (``python3 -S``, as the README runs
    the .pyz): an installed package is then not found, and not missing."""
    return bool(sys.flags.no_site)


def _not_found(detail=None):
    """Why an import found no package: "is not installed", or, with site-packages off,
    that it was not looked for (it may well be installed)."""
    if site_packages_off():
        return "is not looked for: site-packages are off (python3 -S)"
    return "is not installed" + (" (%s)" % detail if detail else "")


def import_nacl(use_nacl, mode="portable"):
    """(nacl.bindings, nacl.exceptions.CryptoError, None) or (None, (), why not).

    An ImportError is the normal "not installed"; any other exception while importing
    (a broken build, a libsodium that fails to load) also leaves PyNaCl out, and says so."""
    if not use_nacl:
        return None, (), "%s=%s" % (CRYPTO_ENV, mode)
    try:
        from nacl import bindings
        from nacl.exceptions import CryptoError
    except ImportError:
        return None, (), "PyNaCl %s" % _not_found()
    except Exception as exc:  # a broken PyNaCl is a missing one: the routes below fall back
        return None, (), "PyNaCl failed to import (%s: %s)" % (type(exc).__name__, exc)
    return bindings, CryptoError, None


def import_pycryptodome(use, mode="stdlib", namespaces=("Crypto", "Cryptodome")):
    """(package name, None) for the first of ``namespaces`` that holds pycryptodome
    (pip's ``Crypto``, else Debian's ``Cryptodome``), or (None, why not)."""
    if not use:
        return None, "%s=%s" % (CRYPTO_ENV, mode)
    for name in namespaces:
        try:
            importlib.import_module(name + ".Cipher.AES")
        except ImportError:
            continue
        except Exception as exc:  # a broken build is a missing one: the routes below fall back
            return None, "pycryptodome failed to import (%s: %s)" % (type(exc).__name__, exc)
        return name, None
    return None, "pycryptodome %s" % _not_found("neither Crypto nor Cryptodome")


def pycryptodome(module, attribute=None):
    """pycryptodome's ``module`` (e.g. "Cipher.Salsa20") from the namespace found, or
    one ``attribute`` of it; None if pycryptodome is not used or lacks it."""
    if PYCRYPTODOME is None:
        return None
    try:
        found = importlib.import_module("%s.%s" % (PYCRYPTODOME, module))
    except ImportError:
        return None
    except Exception:  # a broken module is a missing one: the routes below fall back
        return None
    return found if attribute is None else getattr(found, attribute, None)


def load_libcrypto():
    """(libcrypto.Bindings, None) or (None, why not): ctypes may be missing (a Python
    built without it), or no libcrypto may load."""
    try:
        from cryptoroutes import libcrypto
    except ImportError as exc:
        return None, "ctypes is not available (%s)" % exc
    try:
        lib, why = libcrypto.find()
        return (libcrypto.Bindings(lib), None) if lib else (None, why)
    except Exception as exc:  # never let a strange library stop the program
        return None, "libcrypto could not be used (%s: %s)" % (type(exc).__name__, exc)


def load_system_library(module_name):
    """(that module's Bindings, None) or (None, why not) for one of the system
    libraries beside libcrypto (libsodium, nettle, libgcrypt): a missing library, or
    any failure while loading it, is a family not used."""
    try:
        module = importlib.import_module("cryptoroutes." + module_name)
    except ImportError as exc:
        return None, "ctypes is not available (%s)" % exc
    try:
        return module.load()
    except Exception as exc:  # never let a strange library stop the program
        return None, "%s could not be used (%s: %s)" % (module_name, type(exc).__name__, exc)


try:
    MODE, MODE_ERROR = crypto_mode(os.environ), None
    LEFT_OUT = families(os.environ)
except CryptoSettingError as _error:
    MODE, MODE_ERROR = None, _error
    LEFT_OUT = dict.fromkeys(FAMILIES, "no setting")


def check_setting():
    """Raise the CryptoSettingError of a bad OBFSPROXY_CRYPTO or OBFSPROXY_CRYPTO_SKIP
    (each route module calls this first)."""
    if MODE_ERROR is not None:
        raise MODE_ERROR


def _family(family, load):
    """load() -> (value, why not) when ``family`` may be used, else (None, why it is left out)."""
    return load() if LEFT_OUT[family] is None else (None, LEFT_OUT[family])


# nacl is None without PyNaCl; NaClError is () then, so "except NaClError" catches nothing.
nacl, NaClError, NACL_UNAVAILABLE = import_nacl(True) if LEFT_OUT["PyNaCl"] is None else \
    (None, (), LEFT_OUT["PyNaCl"])
PYCRYPTODOME, PYCRYPTODOME_UNAVAILABLE = _family("pycryptodome", lambda: import_pycryptodome(True))
LIBCRYPTO, LIBCRYPTO_UNAVAILABLE = _family("libcrypto", load_libcrypto)
LIBSODIUM, LIBSODIUM_UNAVAILABLE = _family("libsodium", lambda: load_system_library("libsodium"))
NETTLE, NETTLE_UNAVAILABLE = _family("nettle", lambda: load_system_library("nettle"))
LIBGCRYPT, LIBGCRYPT_UNAVAILABLE = _family("libgcrypt", lambda: load_system_library("libgcrypt"))

# pycryptodome's optional fast routes; each is used only after its import-time self-test.
Poly1305_MAC = pycryptodome("Hash.Poly1305", "Poly1305_MAC")   # a raw-key Poly1305
DH = pycryptodome("Protocol.DH")                                # pycryptodome >= 3.21
Integer = pycryptodome("Math.Numbers", "Integer")               # obfs3's modexp uses it too
Salsa20 = pycryptodome("Cipher.Salsa20")


def unavailable():
    """{family: why it is not used} for the families that are not, e.g.
    {"PyNaCl": "OBFSPROXY_CRYPTO=stdlib", "pycryptodome": "OBFSPROXY_CRYPTO=stdlib"}."""
    found = {"PyNaCl": NACL_UNAVAILABLE, "pycryptodome": PYCRYPTODOME_UNAVAILABLE,
             "libcrypto": LIBCRYPTO_UNAVAILABLE, "libsodium": LIBSODIUM_UNAVAILABLE,
             "nettle": NETTLE_UNAVAILABLE, "libgcrypt": LIBGCRYPT_UNAVAILABLE}
    return {family: why for family, why in found.items() if why}


def passed_over_text(pieces=None, families=None):
    """Why the faster routes were passed over, for the route report and the start-up
    NOTICE: the families not used and the routes that failed a known answer, e.g.
    "PyNaCl not used: OBFSPROXY_CRYPTO=portable; AES-CTR: libcrypto EVP failed its
    known answer". Empty when nothing was passed over. ``pieces`` limits the failed
    routes to those pieces, ``families`` the families named to those."""
    parts = ["%s not used: %s" % (family, why) for family, why in unavailable().items()
             if families is None or family in families]
    for piece, failed in PASSED_OVER.items():
        if failed and (pieces is None or piece in pieces):
            parts.append("%s: %s" % (piece, failed_text(failed)))
    return "; ".join(parts)


def failed_text(failed):
    """Why the routes ``failed`` were passed over, e.g. "pycryptodome Salsa20 seek not
    used: this pycryptodome (3.11.0) lacks seek" (an older library, not a broken one),
    or "libcrypto EVP failed its known answer"."""
    wrong = [name for name in failed if name not in LACKS]
    parts = ["%s not used: this %s lacks %s" % (name, _library_version(name), LACKS[name])
             for name in failed if name in LACKS]
    if wrong:
        parts.append("%s failed its known answer" % ", ".join(wrong))
    return "; ".join(parts)


def _library_version(route):
    """The library of a route name, with its version where known ("pycryptodome (3.11.0)")."""
    family = route.split()[0]
    if family == "pycryptodome" and PYCRYPTODOME:
        try:
            return "pycryptodome (%s)" % importlib.import_module(PYCRYPTODOME).__version__
        except Exception:  # a version is a detail of the text: never let it stop the program
            return family
    return family


def plain_python_notice(pieces):
    """(warn, text) for the one start-up line that says ``pieces`` run in plain Python
    (slower, and not constant-time), with advice that fits how we were started: a
    WARNING only where the user can act by installing a package (a checkout, with
    site-packages on); a NOTICE where the setting left the libraries out, where -S hid
    site-packages, or in the .pyz (the route for a machine where nothing can be installed)."""
    head = "%s run in plain Python here (slower, and not constant-time)" % ", ".join(pieces)
    left_out = [family for family in ("PyNaCl", "pycryptodome", "libsodium")
                if LEFT_OUT.get(family) and LEFT_OUT[family] != "no setting"]
    if left_out:
        return False, "%s: the crypto setting leaves out %s (%s)" % (
            head, ", ".join(left_out), "; ".join(sorted({LEFT_OUT[family] for family in left_out})))
    system = "the system's libsodium (e.g. apt-get install libsodium23) runs them in C with no Python package"
    if site_packages_off():
        return False, ("%s: site-packages are off (python3 -S), so an installed PyNaCl or pycryptodome is "
                       "not looked for; run without -S where one is installed, or %s" % (head, system))
    if in_zipapp():
        return False, "%s: where you may install software, %s" % (head, system)
    return True, ("%s: install PyNaCl or a recent pycryptodome (pip, or python3-nacl / "
                  "python3-pycryptodome), or %s" % (head, system))


def in_zipapp():
    """True when this module runs from a zip archive (obfsproxy.pyz)."""
    loader = globals().get("__loader__")
    return type(loader).__name__ == "zipimporter"


def byte_view(data):
    """A memoryview of ``data`` whose items are bytes, so that len() and slices count
    bytes: a view of another format (``.cast("I")``, an ``array("I")``) counts its
    items, and a route that took that for the length would cover part of the buffer.
    Every route reads its input as its bytes (the tests prove it on each)."""
    view = memoryview(data)
    if view.ndim == 1 and view.format in ("B", "b", "c"):
        return view
    return view.cast("B") if view.c_contiguous else memoryview(view.tobytes())


def gives(function, answers):
    """True if ``function(*args) == expected`` for every (args, expected) in ``answers``.
    Any exception is a failure: what it calls may be missing (None, or an attribute
    gone), take another signature (TypeError) or reject the input (ValueError). A
    missing attribute is remembered (``LACKS``), so that the report can say the library
    lacks a call rather than that it answered wrongly."""
    try:
        return all(function(*args) == expected for args, expected in answers)
    except AttributeError as exc:
        found = re.search(r"attribute '(\w+)'", str(exc))
        _LACKING[function] = found.group(1) if found else str(exc)
        return False
    except Exception:  # a broken fast route must never stop the program: the next one runs
        return False


_LACKING = {}       # candidate function -> the call its library lacks (found by gives)
# route name -> the call its library lacks, for the routes passed over for that reason
LACKS = {}


def choose(candidates, proven):
    """(value, route name, [names of the candidates passed over]) for the first of
    ``candidates`` that ``proven(value)`` accepts.

    ``candidates`` are (value, name) pairs, fastest first; a value of None is a route
    whose library is missing (not tried, not reported). The last pair is the fallback,
    used without a test when no other passes (the pure-Python functions, which the
    tests prove). ``proven`` is ``answers(...)`` or a function of its own."""
    passed_over = []
    for value, name in candidates[:-1]:
        if value is None:
            continue
        if proven(value):
            return value, name, passed_over
        passed_over.append(name)
        if value in _LACKING:
            LACKS[name] = _LACKING[value]
    value, name = candidates[-1]
    return value, name, passed_over


def answers(answers):
    """``proven`` for ``choose``: the candidate function gives every known answer."""
    return lambda function: gives(function, answers)


# piece -> the routes that failed their known answers at import (for ``route_report``)
PASSED_OVER = {}


# --------------------------------------------------------------------------------------
# libcrypto's routes (each None where the library or the name is missing)
# --------------------------------------------------------------------------------------

def _from_libcrypto(make):
    """libcrypto.<make>(LIBCRYPTO), or None without libcrypto or when it fails."""
    if LIBCRYPTO is None:
        return None
    from cryptoroutes import libcrypto
    try:
        return getattr(libcrypto, make)(LIBCRYPTO)
    except Exception:  # a strange library is a missing one: the routes below fall back
        return None


LibAesCtr = _from_libcrypto("make_aes_ctr")
lib_x25519 = _from_libcrypto("make_x25519")
lib_poly1305 = _from_libcrypto("make_poly1305")
LibSipHashStream = _from_libcrypto("make_siphash_stream")
lib_modexp = _from_libcrypto("make_modexp")


# --------------------------------------------------------------------------------------
# The other system libraries' routes (each None where the library or the name is missing)
# --------------------------------------------------------------------------------------

def _from_library(bindings, module_name, make):
    """cryptoroutes.<module_name>.<make>(bindings), or None without the library or
    when it fails."""
    if bindings is None:
        return None
    try:
        return getattr(importlib.import_module("cryptoroutes." + module_name), make)(bindings)
    except Exception:  # a strange library is a missing one: the routes below fall back
        return None


sodium_secretbox = _from_library(LIBSODIUM, "libsodium", "make_secretbox")     # (seal, open)
sodium_x25519 = _from_library(LIBSODIUM, "libsodium", "make_x25519")
sodium_ed25519 = _from_library(LIBSODIUM, "libsodium", "make_ed25519")         # (base, add)
sodium_salsa20_xor = _from_library(LIBSODIUM, "libsodium", "make_salsa20_xor")
sodium_hsalsa20 = _from_library(LIBSODIUM, "libsodium", "make_hsalsa20")
sodium_poly1305 = _from_library(LIBSODIUM, "libsodium", "make_poly1305")
nettle_salsa20_xor = _from_library(NETTLE, "nettle", "make_salsa20_xor")
gcrypt_salsa20_xor = _from_library(LIBGCRYPT, "libgcrypt", "make_salsa20_xor")
# The parts of framebox.py's secretbox: a Salsa20 keyed once per direction, and a
# Poly1305 context per direction, both called on addresses.
sodium_salsa20_keyed = _from_library(LIBSODIUM, "libsodium", "make_salsa20_keyed")
nettle_salsa20_keyed = _from_library(NETTLE, "nettle", "make_salsa20_keyed")
gcrypt_salsa20_keyed = _from_library(LIBGCRYPT, "libgcrypt", "make_salsa20_keyed")
sodium_poly1305_context = _from_library(LIBSODIUM, "libsodium", "make_poly1305_context")
lib_poly1305_context = _from_libcrypto("make_poly1305_context")
gcrypt_poly1305_context = _from_library(LIBGCRYPT, "libgcrypt", "make_poly1305_context")


def _modexp_proven(modexp):
    """``modexp`` agrees with Python's pow() (always right, only slower) on a 255-bit
    and a 1536-bit case, and on a base above the modulus."""
    p255, p1536 = (1 << 255) - 19, (1 << 1536) - 1       # odd moduli (Montgomery's need)
    cases = [(2, (1 << 200) + 12345, p255), (p1536 + 5, (1 << 1535) + 99, p1536), (3, 0, p255)]
    return gives(modexp, [((base, exponent, modulus), pow(base, exponent, modulus))
                          for base, exponent, modulus in cases])


class LibcryptoInteger:
    """pycryptodome's ``Integer`` as obfs3 (and curve25519) call it,
    ``int(Integer(base).inplace_pow(exponent, modulus))``, on libcrypto's
    BN_mod_exp_mont_consttime: ~1.1 ms for obfs3's 1536-bit powers where pycryptodome
    takes ~1.8 and pow() ~11 (measured in one run). ``ROUTE`` names it."""

    ROUTE = "libcrypto BN_mod_exp_mont_consttime"

    def __init__(self, value):
        self.value = int(value)

    def inplace_pow(self, exponent, modulus):
        self.value = lib_modexp(self.value, int(exponent), int(modulus))
        return self

    def __int__(self):
        return self.value


# obfs3's modexp (it proves this by its own known answer): libcrypto's, else pycryptodome's.
ModexpInteger = LibcryptoInteger if lib_modexp and _modexp_proven(lib_modexp) else Integer
