"""The families of crypto routes, for tests that must pass on each (a helper module,
not a test module: test_obfs4_crypto.py and test_obfs4.py both use it).

``use_route(monkeypatch, name)`` patches one family into obfs4_crypto.py (the frame
cipher) and curve25519.py (the keys) until the test ends; ``need`` skips a test whose
library is missing, and fails it in CI, which installs every library.
"""

import pytest
from support import IN_CI

import obfs4_crypto as c
from cryptoroutes import chooser, pure_salsa20
from cryptoroutes import curve25519 as curve

ROUTES = ["chosen route", "PyNaCl", "pycryptodome", "libcrypto", "libsodium", "nettle", "libgcrypt",
          "pure Python"]
SYSTEM_SALSA20 = {"libsodium": "sodium_salsa20_xor", "nettle": "nettle_salsa20_xor",
                  "libgcrypt": "gcrypt_salsa20_xor"}


def need(present, what):
    """Skip a test whose library is missing; in CI, fail it (CI installs everything)."""
    if present:
        return
    if chooser.MODE != "auto" and what == "PyNaCl":
        pytest.skip("PyNaCl is ignored here (%s=%s)" % (chooser.CRYPTO_ENV, chooser.MODE))
    if chooser.MODE in chooser.MODES and what.startswith("pycryptodome") \
            and "pycryptodome" not in chooser.MODES[chooser.MODE]:
        pytest.skip("pycryptodome is ignored here (%s=%s)" % (chooser.CRYPTO_ENV, chooser.MODE))
    family = what.split("'")[0].split()[0]
    if chooser.LEFT_OUT.get(family):
        pytest.skip("%s is left out here (%s)" % (family, chooser.LEFT_OUT[family]))
    if IN_CI:
        pytest.fail("%s is missing, but CI installs it (requirements-dev.txt, .ci/run)" % what)
    pytest.skip("%s is not installed" % what)


def use_route(monkeypatch, name):
    """Patch one family of routes in (until the test ends): "PyNaCl" (secretbox,
    X25519, edwards25519), "pycryptodome" (those three and Poly1305, HSalsa20,
    Salsa20, Elligator2's field power), "libcrypto" (Poly1305, X25519 and the field
    power through ctypes, the rest pure Python), "libsodium" (the system's libsodium
    through ctypes: secretbox, X25519, edwards25519, Poly1305, HSalsa20, Salsa20),
    "nettle" and "libgcrypt" (that library's Salsa20 in framebox.py's secretbox with
    libcrypto's Poly1305, libcrypto for the rest: OBFSPROXY_CRYPTO=stdlib with libsodium
    left out), "pure Python" (the
    pure functions), "chosen route" (nothing).
    Code that imported a patched name itself (obfs4's ``x25519``) must be patched by
    its test too."""
    if name == "PyNaCl":
        need(chooser.nacl is not None, "PyNaCl")
        patch = [(c, "_SecretBoxRoute", c._NaClSecretBox), (curve, "x25519", curve._x25519_nacl),
                 (curve, "_dirty_u", curve._dirty_u_nacl)]
    elif name == "pycryptodome":
        need(chooser.Poly1305_MAC is not None, "pycryptodome's Poly1305_MAC")
        need(chooser.DH is not None, "pycryptodome >= 3.21 (Crypto.Protocol.DH)")
        need(curve._dirty_u_pycryptodome is not curve._dirty_u_unavailable, "pycryptodome's Ed25519 EccPoint")
        need(chooser.Integer is not None, "pycryptodome's Integer")
        need(chooser.Salsa20 is not None, "pycryptodome's Salsa20")
        patch = [(c, "_SecretBoxRoute", c._PortableSecretBox), (c, "poly1305", c._poly1305_pycryptodome),
                 (c, "_salsa20_xor", c._salsa20_xor_pycryptodome),
                 (c, "hsalsa20", c._hsalsa20_pycryptodome), (curve, "x25519", curve._x25519_pycryptodome),
                 (curve, "_dirty_u", curve._dirty_u_pycryptodome),
                 (curve, "_field_pow", curve._field_pow_pycryptodome)]
    elif name == "pure Python":
        patch = [(c, "_SecretBoxRoute", c._PortableSecretBox), (c, "poly1305", c._poly1305_pure),
                 (c, "hsalsa20", c._hsalsa20_pure), (curve, "x25519", curve._x25519_pure),
                 (curve, "_dirty_u", curve._dirty_u_pure), (curve, "_field_pow", curve._field_pow_pure),
                 (c, "_salsa20_xor", pure_salsa20.salsa20_xor)]
    elif name == "libcrypto":
        need(chooser.lib_poly1305 is not None and chooser.lib_x25519 is not None, "libcrypto (OpenSSL 3)")
        need(chooser.lib_modexp is not None, "libcrypto's BN_mod_exp_mont_consttime")
        patch = [(c, "_SecretBoxRoute", c._PortableSecretBox), (c, "poly1305", chooser.lib_poly1305),
                 (c, "hsalsa20", c._hsalsa20_pure), (curve, "x25519", chooser.lib_x25519),
                 (curve, "_dirty_u", curve._dirty_u_pure), (curve, "_field_pow", curve._field_pow_libcrypto),
                 (c, "_salsa20_xor", pure_salsa20.salsa20_xor)]
    elif name == "libsodium":
        need(chooser.sodium_secretbox is not None and curve._dirty_u_sodium is not None, "libsodium")
        patch = [(c, "_SecretBoxRoute", c._SodiumSecretBox), (c, "poly1305", chooser.sodium_poly1305),
                 (c, "hsalsa20", chooser.sodium_hsalsa20), (curve, "x25519", chooser.sodium_x25519),
                 (curve, "_dirty_u", curve._dirty_u_sodium), (c, "_salsa20_xor", chooser.sodium_salsa20_xor)]
    elif name in ("nettle", "libgcrypt"):
        # What OBFSPROXY_CRYPTO=stdlib runs with libsodium left out: this library's Salsa20
        # in framebox.py's secretbox, libcrypto (where it is) for the rest.
        salsa20 = getattr(chooser, SYSTEM_SALSA20[name])
        need(salsa20 is not None, name)
        keyed = getattr(chooser, SYSTEM_SALSA20[name].replace("_xor", "_keyed"))
        context = chooser.lib_poly1305_context or chooser.gcrypt_poly1305_context
        box = c._DirectSecretBox if keyed and context else c._PortableSecretBox
        patch = [(c, "_SecretBoxRoute", box), (c, "_salsa20_keyed", keyed), (c, "_poly1305_context", context),
                 (c, "hsalsa20", c._hsalsa20_pure),
                 (c, "poly1305", chooser.lib_poly1305 or c._poly1305_pure),
                 (curve, "x25519", chooser.lib_x25519 or curve._x25519_pure),
                 (curve, "_dirty_u", curve._dirty_u_pure),
                 (curve, "_field_pow",
                  curve._field_pow_libcrypto if chooser.lib_modexp else curve._field_pow_pure),
                 (c, "_salsa20_xor", salsa20)]
    else:
        assert name == "chosen route"
        patch = []
    for module, attribute, value in patch:
        monkeypatch.setattr(module, attribute, value)
