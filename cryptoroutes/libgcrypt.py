"""cryptoroutes/libgcrypt.py: Salsa20 from the system's libgcrypt through ``ctypes``.

libgcrypt is GnuPG's crypto library; most Linux systems carry it (systemd links it).
Of what obfs4 needs it offers Salsa20/20 (``GCRY_CIPHER_SALSA20`` in stream mode) and
Poly1305 with a raw one-time key (``GCRY_MAC_POLY1305``), which is all a frame needs
(see nettle.py). ``salsa20_xor`` opens a handle, keys it, gives it the nonce (which
starts the block counter at 0), uses it once and closes it, per call; the keyed
Salsa20 and the Poly1305 context of cryptoroutes/framebox.py keep one handle per
direction of a connection (closed when it goes) and call it on addresses.

libgcrypt wants to be initialised by the program before use; ``load`` does what its
manual asks of an application that has not done it yet: ``gcry_check_version``, no
secure memory (nothing here asks for it), initialisation finished. Where the process
has already initialised it, that is left alone.

Nothing here is trusted: obfs4_crypto.py runs it against known answers before any
transport does, and a missing library or function leaves it None (syslib.py finds
the library). Every length is a byte length (syslib.readable).
"""

import ctypes
import weakref

from cryptoroutes import syslib

GCRY_CIPHER_SALSA20 = 313
GCRY_CIPHER_MODE_STREAM = 4
GCRY_MAC_POLY1305 = 501
GCRYCTL_DISABLE_SECMEM = 37
GCRYCTL_INITIALIZATION_FINISHED = 38
GCRYCTL_INITIALIZATION_FINISHED_P = 39


class Bindings:
    """libgcrypt's cipher functions (None where missing)."""

    def __init__(self, lib, name, version):
        b, void_p, size_t, uint = syslib.bind, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint
        self.lib, self.name, self.version = lib, name, "libgcrypt %s" % version
        self.open = b(lib, "gcry_cipher_open", uint, ctypes.POINTER(void_p), ctypes.c_int, ctypes.c_int,
                      ctypes.c_uint)
        self.close = b(lib, "gcry_cipher_close", None, void_p)
        self.setkey = b(lib, "gcry_cipher_setkey", uint, void_p, ctypes.c_char_p, size_t)
        self.setiv = b(lib, "gcry_cipher_setiv", uint, void_p, ctypes.c_char_p, size_t)
        self.encrypt = b(lib, "gcry_cipher_encrypt", uint, void_p, void_p, size_t, void_p, size_t)
        # MACs, on addresses (framebox.py)
        own = syslib.bind_own
        self.mac_open = own(lib, "gcry_mac_open", uint, ctypes.POINTER(void_p), ctypes.c_int, uint, void_p)
        self.mac_close = own(lib, "gcry_mac_close", None, void_p)
        self.mac_setkey = own(lib, "gcry_mac_setkey", uint, void_p, void_p, size_t)
        self.mac_write = own(lib, "gcry_mac_write", uint, void_p, void_p, size_t)
        self.mac_read = own(lib, "gcry_mac_read", uint, void_p, void_p, void_p)


def load():
    """(Bindings, None) or (None, why not)."""
    lib, name, why = syslib.load("libgcrypt", "gcry_cipher_open")
    if lib is None:
        return None, why
    check_version = syslib.bind(lib, "gcry_check_version", ctypes.c_char_p, ctypes.c_char_p)
    control = getattr(lib, "gcry_control", None)
    if check_version is None or control is None:
        return None, "libgcrypt (%s) lacks gcry_check_version" % name
    control.restype = ctypes.c_uint
    version = check_version(None)       # initialises the library; returns its version
    if not version:
        return None, "libgcrypt (%s): gcry_check_version failed" % name
    if not control(GCRYCTL_INITIALIZATION_FINISHED_P, 0):
        control(GCRYCTL_DISABLE_SECMEM, 0)
        control(GCRYCTL_INITIALIZATION_FINISHED, 0)
    return Bindings(lib, name, version.decode("ascii", "replace")), None


def make_salsa20_xor(bindings):
    """salsa20_xor(key32, nonce8, data) -> bytes, Salsa20/20 from block 0 XOR data, or None."""
    b = bindings
    if not (b.open and b.close and b.setkey and b.setiv and b.encrypt):
        return None
    open_, close, setkey, setiv, encrypt = b.open, b.close, b.setkey, b.setiv, b.encrypt
    buffer_of, readable, handle_of = ctypes.create_string_buffer, syslib.readable, ctypes.c_void_p

    def salsa20_xor(key32, nonce8, data):
        if len(key32) != 32 or len(nonce8) != 8:
            raise ValueError("Salsa20 takes a 32-byte key and an 8-byte nonce, not %d and %d"
                             % (len(key32), len(nonce8)))
        source, size = readable(data)
        out, handle = buffer_of(size or 1), handle_of()
        if open_(ctypes.byref(handle), GCRY_CIPHER_SALSA20, GCRY_CIPHER_MODE_STREAM, 0) != 0:
            raise ValueError("gcry_cipher_open(SALSA20) failed")
        try:
            if setkey(handle, bytes(key32), 32) != 0 or setiv(handle, bytes(nonce8), 8) != 0 or \
                    (size and encrypt(handle, out, size, source, size) != 0):
                raise ValueError("libgcrypt's Salsa20 failed")
        finally:
            close(handle)
        return out.raw[:size]
    return salsa20_xor


def _closed_with(owner, close, handle):
    """Close ``handle`` when ``owner`` goes (or at exit)."""
    weakref.finalize(owner, close, handle)


def make_salsa20_keyed(bindings):
    """keyed(key32) -> crypt(nonce8, size, dst, src), or None: Salsa20/20 on one handle
    keyed once; each ``crypt`` sets the nonce (block counter back to 0) and writes
    ``size`` bytes of src XOR keystream at dst (addresses; may be equal). The handle
    is closed when ``crypt`` goes (nettle.py's ``make_salsa20_keyed`` says why)."""
    b = bindings
    if not (b.open and b.close and b.setkey and b.setiv and b.encrypt):
        return None
    open_, close, setkey, setiv, encrypt = b.open, b.close, b.setkey, b.setiv, b.encrypt

    def keyed(key32):
        if len(key32) != 32:
            raise ValueError("Salsa20 takes a 32-byte key, not %d" % len(key32))
        handle = ctypes.c_void_p()
        if open_(ctypes.byref(handle), GCRY_CIPHER_SALSA20, GCRY_CIPHER_MODE_STREAM, 0) != 0:
            raise ValueError("gcry_cipher_open(SALSA20) failed")
        if setkey(handle, bytes(key32), 32) != 0:
            close(handle)
            raise ValueError("libgcrypt's Salsa20 refused the key")
        handle = handle.value

        def crypt(nonce8, size, dst, src):
            if setiv(handle, nonce8, 8) != 0 or (size and encrypt(handle, dst, size, src, size) != 0):
                raise ValueError("libgcrypt's Salsa20 failed")
        _closed_with(crypt, close, handle)
        return crypt
    return keyed


def make_poly1305_context(bindings):
    """new() -> mac(key_address, data_address, size, tag_address), or None: Poly1305
    with a raw one-time key on one ``GCRY_MAC_POLY1305`` handle, kept for the frames
    of one direction (closed when ``mac`` goes): ``gcry_mac_setkey`` starts a new
    message under the new key, then write and read (the 16-byte tag at tag_address)."""
    b = bindings
    if not (b.mac_open and b.mac_close and b.mac_setkey and b.mac_write and b.mac_read):
        return None
    mac_open, close, setkey, write, read = b.mac_open, b.mac_close, b.mac_setkey, b.mac_write, b.mac_read

    def new():
        handle = ctypes.c_void_p()
        if mac_open(ctypes.byref(handle), GCRY_MAC_POLY1305, 0, None) != 0:
            raise ValueError("gcry_mac_open(POLY1305) failed")
        handle = handle.value
        length = ctypes.c_size_t(16)
        length_address = ctypes.addressof(length)

        def mac(key_address, data_address, size, tag_address, _length=length):
            _length.value = 16
            if setkey(handle, key_address, 32) != 0 or write(handle, data_address, size) != 0 or \
                    read(handle, tag_address, length_address) != 0:
                raise ValueError("libgcrypt's Poly1305 failed")
        _closed_with(mac, close, handle)
        return mac
    return new
