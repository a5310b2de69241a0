"""cryptoroutes/chooser.py: the crypto libraries we may use, and how each crypto route is chosen.

Every primitive the transports run has candidate routes, fastest first, from four
families: libsodium through PyNaCl; pycryptodome's C code (its ``Crypto`` namespace
from pip, or ``Cryptodome`` from Debian's python3-pycryptodome: the same code); OpenSSL's
libcrypto, the one Python's own ``ssl`` runs, through ``ctypes`` (libcrypto.py); and
pure Python (pure_aes.py, pure_salsa20.py and the pure functions of each module). Where
a libcrypto route measured faster than pycryptodome's (AES-CTR: its set-up and its bulk;
Poly1305; X25519; modular powers; a streaming SipHash, which nothing else offers), it
comes first, whatever is installed. A candidate is used only if it gives
every known answer (copied from ``shared/vectors``; the tests check the copies) when its
module is imported; one that is missing, raises, or answers wrongly is skipped for the
next. The last candidate, the pure-Python function, is the fallback (the tests prove it
on the same vectors), so an upgrade of any library can make us slower, never wrong.
``choose`` does this; ``PASSED_OVER`` remembers which routes failed, and
``unavailable()`` why a family is not used at all, for the route report.

``OBFSPROXY_CRYPTO`` in the environment picks the families (``MODES``):

=============  =======================================================================
(unset), auto  every family that imports
portable       ignore PyNaCl, as if it were not installed (the pycryptodome routes)
stdlib         ignore PyNaCl and pycryptodome: only what Python alone has (libcrypto
               through ctypes, then pure Python), as on a machine with nothing installed
=============  =======================================================================

The tests, CI and the benchmark use ``portable`` and ``stdlib`` to run those routes on a
machine that has every library. Any other value is an error: a typo must not silently
pick a route. Importing this module never fails for it (obfsproxy.py imports it before
it can report errors); the first import of a route module (aes_ctr.py, curve25519.py,
...) raises ``CryptoSettingError``, which obfsproxy.py reports in one line, and to Tor
as ENV-ERROR.

We call pycryptodome and PyNaCl only through their public functions: no underscored
names, no cffi handles. (Calling pycryptodome's ``_raw_api`` C handles directly saved
~3.5 µs per frame, but a private route can change its meaning in any release.) The one
lightly documented name is ``Poly1305.Poly1305_MAC`` (a raw-key Poly1305), used only
after its known answers. libcrypto is called only through its public, documented API.
"""

import importlib
import os

CRYPTO_ENV = "OBFSPROXY_CRYPTO"
# value -> (use PyNaCl, use pycryptodome)
MODES = {"auto": (True, True), "portable": (False, True), "stdlib": (False, False)}


class KnownAnswerError(RuntimeError):
    """The crypto routes cannot run as asked: a primitive with no fallback gave a wrong
    known answer at import, or (``CryptoSettingError``) OBFSPROXY_CRYPTO names no
    family. obfsproxy.py says it in one line, and to Tor as ENV-ERROR."""


class CryptoSettingError(KnownAnswerError, ValueError):
    """OBFSPROXY_CRYPTO has a value that is not in ``MODES``."""


def crypto_mode(environ):
    """"auto", "portable" or "stdlib" from OBFSPROXY_CRYPTO (unset or empty: "auto");
    CryptoSettingError, in one line that names the values, for any other."""
    value = environ.get(CRYPTO_ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise CryptoSettingError(
            "%s=%r is not a crypto route setting: use 'auto' (the default: the fastest route that "
            "gives the known answers), 'portable' (ignore PyNaCl) or 'stdlib' (no package: libcrypto "
            "through ctypes, then pure Python)" % (CRYPTO_ENV, environ[CRYPTO_ENV]))
    return value


def use_nacl(environ):
    """True if OBFSPROXY_CRYPTO lets PyNaCl be used (unset or ``auto``)."""
    return MODES[crypto_mode(environ)][0]


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
        return None, (), "PyNaCl is not installed"
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
    return None, "pycryptodome is not installed (neither Crypto nor Cryptodome)"


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


try:
    MODE, MODE_ERROR = crypto_mode(os.environ), None
except CryptoSettingError as _error:
    MODE, MODE_ERROR = None, _error



def check_setting():
    """Raise the CryptoSettingError of a bad OBFSPROXY_CRYPTO (each route module calls
    this first; obfs2 and obfs3 get it from ``from cryptoroutes.aes_ctr import AES``)."""
    if MODE_ERROR is not None:
        raise MODE_ERROR


USE_NACL, USE_PYCRYPTODOME = MODES.get(MODE, (False, False))
# nacl is None without PyNaCl; NaClError is () then, so "except NaClError" catches nothing.
nacl, NaClError, NACL_UNAVAILABLE = import_nacl(USE_NACL, MODE)
PYCRYPTODOME, PYCRYPTODOME_UNAVAILABLE = import_pycryptodome(USE_PYCRYPTODOME, MODE)
LIBCRYPTO, LIBCRYPTO_UNAVAILABLE = load_libcrypto() if MODE else (None, "no setting")

# pycryptodome's optional fast routes; each is used only after its import-time self-test.
Poly1305_MAC = pycryptodome("Hash.Poly1305", "Poly1305_MAC")   # a raw-key Poly1305
DH = pycryptodome("Protocol.DH")                                # pycryptodome >= 3.21
Integer = pycryptodome("Math.Numbers", "Integer")               # obfs3's modexp uses it too
Salsa20 = pycryptodome("Cipher.Salsa20")


def unavailable():
    """{family: why it is not used} for the families that are not, e.g.
    {"PyNaCl": "OBFSPROXY_CRYPTO=stdlib", "pycryptodome": "OBFSPROXY_CRYPTO=stdlib"}."""
    found = {"PyNaCl": NACL_UNAVAILABLE, "pycryptodome": PYCRYPTODOME_UNAVAILABLE,
             "libcrypto": LIBCRYPTO_UNAVAILABLE}
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
            parts.append("%s: %s failed its known answer" % (piece, ", ".join(failed)))
    return "; ".join(parts)


def gives(function, answers):
    """True if ``function(*args) == expected`` for every (args, expected) in ``answers``.
    Any exception is a failure: what it calls may be missing (None, or an attribute
    gone), take another signature (TypeError) or reject the input (ValueError)."""
    try:
        return all(function(*args) == expected for args, expected in answers)
    except Exception:  # a broken fast route must never stop the program: the next one runs
        return False


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
