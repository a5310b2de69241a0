"""cryptoroutes: every crypto primitive the transports run, each on the fastest route
that gives its known answers on this machine.

=================  ====================================================================
module             what it is
=================  ====================================================================
chooser.py         the families of routes (PyNaCl, pycryptodome, system libraries
                   through ``ctypes``, plain Python), ``OBFSPROXY_CRYPTO``, and how a
                   route is chosen: fastest first, only after its known answers
aes_ctr.py         AES-CTR for obfs2 and obfs3, and ``AES.new`` in pycryptodome's words
curve25519.py      obfs4's keys: X25519, the "dirty" Edwards public key, Elligator2
libcrypto.py       OpenSSL's libcrypto (the one Python's ``ssl`` runs) through ctypes
libsodium.py       the system's libsodium through ctypes (what PyNaCl would give)
nettle.py          the system's nettle through ctypes (Salsa20)
libgcrypt.py       the system's libgcrypt through ctypes (Salsa20, Poly1305)
framebox.py        secretbox under a cached subkey on a system library's Salsa20 and
                   Poly1305, keyed once per direction, on buffers of its own
syslib.py          how a system library is found (never required), and handed buffers
pure_aes.py        AES and AES-CTR in plain Python, the last resort
pure_salsa20.py    Salsa20 in plain Python, many blocks side by side, the last resort
=================  ====================================================================

The transports import from here; nothing here imports a transport (tools/check_imports.py
checks it), so the layer can be read, tested and replaced on its own.
"""
