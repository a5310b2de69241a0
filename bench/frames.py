#!/usr/bin/env python3
"""frames.py: what one obfs4 frame costs on each crypto route this machine has.

    python3 bench/frames.py [--rounds N]

For every route that loads here (PyNaCl, pycryptodome, libcrypto, libsodium, nettle,
libgcrypt, plain Python), in one process and in interleaved rounds (route A, B, C, A,
B, C, ...), so that the machine's load falls on all of them alike:

* Salsa20 of one 1,462-byte frame, key and nonce set each time (what the portable
  secretbox asks of a Salsa20 route for each frame);
* Poly1305 of the same frame;
* seal + open of a 1,430-byte packet with obfs4's secretbox on that route (the
  Salsa20 route with the best Poly1305 of the run, or the route's own box), and on
  each "direct" pair (cryptoroutes/framebox.py: nettle's or libgcrypt's Salsa20 keyed
  once, with libcrypto's or libgcrypt's Poly1305 context, on buffers of their own).

Prints the best and the median of the rounds, in µs. The machine is shared: compare
the routes of one run with each other, not with another run's figures.
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import obfs4_crypto as c  # noqa: E402  (found through the path above)
from cryptoroutes import chooser, pure_salsa20  # noqa: E402

FRAME, PACKET = 1462, 1430


def salsa20_routes():
    """{name: salsa20_xor(key, nonce8, data)} for the routes that loaded here."""
    found = {"libsodium": chooser.sodium_salsa20_xor, "nettle": chooser.nettle_salsa20_xor,
             "libgcrypt": chooser.gcrypt_salsa20_xor,
             "pycryptodome": c._salsa20_xor_pycryptodome if chooser.Salsa20 else None,
             "plain Python": pure_salsa20.salsa20_xor}
    return {name: route for name, route in found.items() if route is not None}


def poly1305_routes():
    found = {"libsodium": chooser.sodium_poly1305, "libcrypto": chooser.lib_poly1305,
             "pycryptodome": c._poly1305_pycryptodome if chooser.Poly1305_MAC else None,
             "plain Python": c._poly1305_pure}
    return {name: route for name, route in found.items() if route is not None}


def box_routes(polys):
    """{name: (SecretBox class, salsa20 or None, poly1305 or None)}: the one-call boxes,
    then the portable box on each Salsa20 route with the Poly1305 it runs with (libsodium's
    beside libsodium's Salsa20; without libsodium, the fastest of the others)."""
    boxes = {}
    if chooser.nacl is not None:
        boxes["PyNaCl crypto_secretbox"] = (c._NaClSecretBox, None, None)
    if chooser.sodium_secretbox is not None:
        boxes["libsodium crypto_secretbox_easy"] = (c._SodiumSecretBox, None, None)
    without = next(name for name in ("libcrypto", "pycryptodome", "plain Python") if name in polys)
    for name, salsa20 in salsa20_routes().items():
        poly_name = "libsodium" if name == "libsodium" else without
        boxes["Salsa20 %s + Poly1305 %s" % (name, poly_name)] = (c._PortableSecretBox, salsa20,
                                                                 polys[poly_name])
    keyed = {"nettle": chooser.nettle_salsa20_keyed, "libgcrypt": chooser.gcrypt_salsa20_keyed}
    contexts = {"libcrypto EVP_MAC": chooser.lib_poly1305_context,
                "libgcrypt gcry_mac": chooser.gcrypt_poly1305_context}
    for name, salsa20 in keyed.items():
        for poly_name, context in contexts.items():
            if salsa20 is not None and context is not None:
                boxes["direct: %s keyed + Poly1305 %s" % (name, poly_name)] = (c._DirectSecretBox, salsa20,
                                                                               context)
    return boxes


def timed(work, count):
    start = time.perf_counter()
    for _ in range(count):
        work()
    return (time.perf_counter() - start) / count * 1e6


def seal_and_open(box_class, salsa20, poly1305, packet, count):
    """µs for one seal and one open, on ``box_class`` with those routes patched in."""
    saved = c._salsa20_xor, c.poly1305, c._salsa20_keyed, c._poly1305_context
    if box_class is c._DirectSecretBox:
        c._salsa20_keyed, c._poly1305_context = salsa20, poly1305
    elif salsa20 is not None:
        c._salsa20_xor, c.poly1305 = salsa20, poly1305
    try:
        box = SecretBoxOf(box_class)
        sealed = [box.seal(n, packet) for n in range(1, count + 1)]
        start = time.perf_counter()
        for n in range(1, count + 1):
            box.seal(n, packet)
        for n in range(1, count + 1):
            box.open_view(n, sealed[n - 1])
        return (time.perf_counter() - start) / count * 1e6
    finally:
        c._salsa20_xor, c.poly1305, c._salsa20_keyed, c._poly1305_context = saved


def SecretBoxOf(box_class):
    key, prefix = os.urandom(32), os.urandom(16)
    box = object.__new__(box_class)
    box.__init__(key, prefix)
    return box


def main(argv=None):
    parser = argparse.ArgumentParser(description="µs per obfs4 frame on each crypto route here")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds [7]")
    parser.add_argument("--count", type=int, default=300, help="frames a round, per route [300]")
    options = parser.parse_args(argv)
    key, nonce, frame, packet = os.urandom(32), os.urandom(8), os.urandom(FRAME), os.urandom(PACKET)
    polys = poly1305_routes()
    cases = {}
    for name, salsa20 in salsa20_routes().items():
        count = options.count if name != "plain Python" else max(10, options.count // 20)
        cases["Salsa20 %s" % name] = (lambda s=salsa20: s(key, nonce, frame), count)
    for name, poly1305 in polys.items():
        count = options.count if name != "plain Python" else max(10, options.count // 20)
        cases["Poly1305 %s" % name] = (lambda p=poly1305: p(key, frame), count)
    boxes = box_routes(polys)
    figures = {name: [] for name in list(cases) + ["seal+open " + name for name in boxes]}
    for _ in range(options.rounds):
        for name, (work, count) in cases.items():
            figures[name].append(timed(work, count))
        for name, (box_class, salsa20, poly1305) in boxes.items():
            count = options.count if "plain Python" not in name else max(10, options.count // 20)
            figures["seal+open " + name].append(seal_and_open(box_class, salsa20, poly1305, packet, count))
    print("obfs4 per-frame cost, µs (best / median of %d interleaved rounds); Salsa20 and Poly1305 "
          "of a %d-byte frame, seal + open of a %d-byte packet" % (options.rounds, FRAME, PACKET))
    libraries = (chooser.LIBSODIUM, chooser.NETTLE, chooser.LIBGCRYPT, chooser.LIBCRYPTO)
    print("loaded libraries: %s" % "; ".join(found.version for found in libraries if found is not None))
    width = max(len(name) for name in figures)
    for name, found in figures.items():
        print("%-*s  %8.1f  %8.1f" % (width, name, min(found), statistics.median(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
