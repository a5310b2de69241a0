"""cryptoroutes/framebox.py: NaCl's secretbox under a cached subkey, on a system library's
Salsa20 and Poly1305 called straight on buffers of its own.

Where libsodium is missing, obfs4's frames (obfs4_crypto.py) run on nettle's or
libgcrypt's Salsa20 and libcrypto's or libgcrypt's Poly1305 through ``ctypes``. The C
work of a 1,430-byte frame is ~5 + ~2 µs; the generic route around it (a Salsa20
function, then a Poly1305 function, each on bytes) cost 24-35 µs for seal + open,
because each call made its buffers, converted its arguments, set its key and copied
its result, and EVP_Q_mac looked its algorithm up by name every time. Here one
``FrameBox`` per direction keeps, for the life of the connection:

* a Salsa20 keyed once with the direction's subkey (``crypt(nonce8, size, dst, src)``:
  the nonce restarts the block counter at 0);
* a Poly1305 context (``mac(key, data, size, tag)``, all four addresses);
* two buffers it writes and reads by address, grown to the largest frame seen.

What one frame does (n = len(packet), stream = Salsa20(subkey, nonce8) from block 0)::

    inbuf  [ 0 .. 32: zero ][ 32 .. 32+n: packet or ciphertext ]
    outbuf [ 0 .. 16: tag  ][ 16 .. 48: stream[0:32] = Poly1305 key ][ 48 .. 48+n ]

    seal:  inbuf[32:] = packet;     crypt -> outbuf[16:48+n] = stream ^ (0^32 | packet)
           tag = Poly1305(outbuf[16:48], outbuf[48:48+n]);  outbuf[32:48] = tag
           box = outbuf[32 : 48+n]  (tag | ciphertext, one copy out)
    open:  inbuf[32:] = box[16:];   crypt -> outbuf[16:48+n] = stream ^ (0^32 | ct)
           tag = Poly1305(outbuf[16:48], inbuf[32:32+n]);  tag == box[0:16] (constant-time)
           packet = outbuf[48 : 48+n]  (one copy out, only when the tag matches)

Per frame that is two C calls for Salsa20 (nettle: nonce, crypt; libgcrypt: setiv,
encrypt) and three for Poly1305 (key, data, tag; one for libsodium), each on ints,
and two copies of the frame in Python (in and out).

A ``FrameBox`` is one direction of one connection, used by one thread at a time (its
buffers are its own; obfs4's encoder and decoder each own one). The buffers hold the
last frame's keystream, plaintext and Poly1305 key until the next frame overwrites
them, as secret as the subkey beside them, and go with it. Nothing here is trusted:
obfs4_crypto.py proves each part by known answers (``salsa20_xor_of``,
``poly1305_of``) and the box by the secretbox answers before any frame uses it.
"""

import hmac

from cryptoroutes import syslib

TAG = 16


def _bytes_view(data):
    """``data`` itself when it is bytes, else a 1-D memoryview of unsigned bytes, which a
    slice of a bytearray's view takes (a view of "c", "b" or "I" items is cast)."""
    if type(data) is bytes:
        return data
    view = memoryview(data)
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B") if view.c_contiguous else memoryview(view.tobytes())


class FrameBox:
    """secretbox under one subkey (XSalsa20's HSalsa20 already applied): ``seal(nonce8,
    packet)`` -> tag | ciphertext, ``open(nonce8, box)`` -> packet or ValueError("bad
    tag"). ``keyed`` and ``new_mac`` are a library's ``make_salsa20_keyed`` and
    ``make_poly1305_context`` results (the module docstring says what each does)."""

    def __init__(self, keyed, new_mac, subkey32):
        self._crypt = keyed(subkey32)
        self._mac = new_mac()
        self._room = -1                 # the largest packet the buffers take (none yet)

    def _grow(self, size):
        """Buffers for a packet of ``size`` bytes (rounded up, so that a stream of
        growing frames does not reallocate at each)."""
        room = max(size, 2 * self._room, 1536)
        self._in, self._in_view, self._in_address = syslib.buffer_with_address(32 + room)
        self._out, self._out_view, self._out_address = syslib.buffer_with_address(48 + room)
        self._room = room

    def seal(self, nonce8, packet):
        packet = _bytes_view(packet)
        size = len(packet)
        if size > self._room:
            self._grow(size)
        out, address = self._out_view, self._out_address
        self._in_view[32:32 + size] = packet
        self._crypt(nonce8, 32 + size, address + 16, self._in_address)
        self._mac(address + 16, address + 48, size, address)
        out[32:48] = out[0:16]
        return bytes(out[32:48 + size])

    def open(self, nonce8, box):
        box = _bytes_view(box)
        size = len(box) - TAG
        if size < 0:
            raise ValueError("bad tag")
        if size > self._room:
            self._grow(size)
        out, address, in_address = self._out_view, self._out_address, self._in_address
        self._in_view[32:32 + size] = box[TAG:]
        self._crypt(nonce8, 32 + size, address + 16, in_address)
        self._mac(address + 16, in_address + 32, size, address)
        if not hmac.compare_digest(out[0:16], box[0:TAG]):
            raise ValueError("bad tag")
        return bytes(out[48:48 + size])


def salsa20_xor_of(keyed):
    """salsa20_xor(key32, nonce8, data) -> bytes on ``keyed`` (a key and buffers per
    call): what the known answers of a Salsa20 route take."""
    def salsa20_xor(key32, nonce8, data):
        if len(nonce8) != 8:
            raise ValueError("Salsa20 takes an 8-byte nonce, not %d" % len(nonce8))
        data = _bytes_view(data)
        size = len(data)
        _, source, source_address = syslib.buffer_with_address(size or 1)
        _, out, out_address = syslib.buffer_with_address(size or 1)
        source[:size] = data
        keyed(key32)(bytes(nonce8), size, out_address, source_address)
        return bytes(out[:size])
    return salsa20_xor


def poly1305_of(new_mac):
    """poly1305(key32, data) -> the 16-byte tag on a new context of ``new_mac``: what the
    known answers of a Poly1305 route take."""
    def poly1305(key32, data):
        if len(key32) != 32:
            raise ValueError("Poly1305 takes a 32-byte key, not %d" % len(key32))
        data = _bytes_view(data)
        size = len(data)
        _, buffer, address = syslib.buffer_with_address(48 + size)
        buffer[16:48] = bytes(key32)
        buffer[48:48 + size] = data
        new_mac()(address + 16, address + 48, size, address)
        return bytes(buffer[0:16])
    return poly1305
