"""accel.py: the optional accelerator (PyNaCl), and how each crypto route is chosen.

obfs4's primitives (obfs4_crypto.py, curve25519.py) each have candidate routes, fastest
first: libsodium through PyNaCl when it is installed, then pycryptodome's C code, then
pure Python. A candidate is used only if it gives every known answer (copied from
``shared/vectors``; the tests check the copies) when its module is imported; one that
is missing, raises, or answers wrongly is skipped for the next. The last candidate,
the pure-Python function, is the fallback (the tests prove it on the same vectors), so
an upgrade of either library can make us slower, never wrong. ``choose`` does this;
``PASSED_OVER`` remembers which routes failed, for the route report.

``OBFSPROXY_CRYPTO=portable`` in the environment makes us ignore PyNaCl, as if it were
not installed: the tests, CI's second run and the benchmark use it to run the
pycryptodome routes on a machine that has both. Unset (or ``auto``) means "use PyNaCl
when it imports"; any other value is an error.

We call pycryptodome and PyNaCl only through their public functions: no underscored
names, no cffi handles. (Calling pycryptodome's ``_raw_api`` C handles directly saved
~3.5 µs per frame, but a private route can change its meaning in any release.) The one
lightly documented name is ``Crypto.Hash.Poly1305.Poly1305_MAC`` (a raw-key Poly1305),
used only after its known answers.
"""

import os

# pycryptodome's optional fast routes; each is used only after its import-time self-test.
try:
    from Crypto.Hash.Poly1305 import Poly1305_MAC  # a raw-key Poly1305
except ImportError:
    Poly1305_MAC = None
try:
    from Crypto.Protocol import DH  # pycryptodome >= 3.21
except ImportError:
    DH = None
try:
    from Crypto.Math.Numbers import Integer  # obfs3's modexp uses it too
except ImportError:
    Integer = None

CRYPTO_ENV = "OBFSPROXY_CRYPTO"


def use_nacl(environ):
    """False if ``OBFSPROXY_CRYPTO=portable`` (ignore PyNaCl), True if unset or ``auto``;
    any other value is a ValueError (a typo must not silently pick a route)."""
    value = environ.get(CRYPTO_ENV, "").strip().lower()
    if value in ("", "auto"):
        return True
    if value == "portable":
        return False
    raise ValueError("%s=%r: use 'portable' (ignore PyNaCl) or 'auto' (the default)"
                     % (CRYPTO_ENV, environ[CRYPTO_ENV]))


def import_nacl(use_nacl):
    """(nacl.bindings, nacl.exceptions.CryptoError, None) or (None, (), why not).

    An ImportError is the normal "not installed"; any other exception while importing
    (a broken build, a libsodium that fails to load) also leaves PyNaCl out, and says so."""
    if not use_nacl:
        return None, (), "%s=portable" % CRYPTO_ENV
    try:
        from nacl import bindings
        from nacl.exceptions import CryptoError
    except ImportError:
        return None, (), "PyNaCl is not installed"
    except Exception as exc:  # a broken PyNaCl is a missing one: the routes below fall back
        return None, (), "PyNaCl failed to import (%s: %s)" % (type(exc).__name__, exc)
    return bindings, CryptoError, None


# nacl is None without PyNaCl; NaClError is () then, so "except NaClError" catches nothing.
nacl, NaClError, NACL_UNAVAILABLE = import_nacl(use_nacl(os.environ))


class KnownAnswerError(RuntimeError):
    """A primitive that has no fallback gave a wrong known answer at import."""


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
