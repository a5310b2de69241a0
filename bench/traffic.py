"""The test traffic: deterministic streams whose SHA-256 proves every byte, and the
sink/echo service at the far end of every tunnel (its own process: ``bench.py _sink``)."""

import hashlib
import os
import queue
import random
import socket
import struct
import sys
import threading

MiB = 1 << 20

# Tor's first writes through webtunnel (measured), played as turns against the echo: the
# client's ClientHello record, CCS + Finished, 33, two writes of two cells, a cell, three
# cells, then a short one. Record shaping cuts every one of them (its first 16 KiB).
TOR_TURNS = (517, 80, 33, 1050, 1050, 536, 1564, 200)
BLOCK = MiB                                 # size of the repeated random block
HEADER = struct.Struct("!4sQ4x")            # what the generator asks the sink: mode, size
TAG_UP, TAG_DOWN, TAG_ECHO = 1, 2, 3        # stream tags written into every chunk
ECHO_PAYLOAD = 64 * 1024                    # per tunnel in the concurrency test
PING = b"0123456789abcdef"                  # the small echo of the setup test
SOCKET_TIMEOUT = 120.0                      # no single socket operation may block longer

# --- Test data ---------------------------------------------------------------------

def _make_block():
    rng = random.Random(0x0BF5)             # deterministic, same in both processes
    return rng.getrandbits(8 * BLOCK).to_bytes(BLOCK, "little")


RANDOM_BLOCK = _make_block()


def chunks(tag, size):
    """The deterministic stream ``tag`` of ``size`` bytes, as memoryviews of at most
    1 MiB. Each view is only valid until the next one is produced (one buffer is
    reused), which suits sendall() and hash.update()."""
    buf = bytearray(RANDOM_BLOCK)
    view = memoryview(buf)
    for number, offset in enumerate(range(0, size, BLOCK)):
        struct.pack_into("!II", buf, 0, tag, number & 0xFFFFFFFF)
        yield view[:min(BLOCK, size - offset)]


def stream_digest(tag, size):
    digest = hashlib.sha256()
    for chunk in chunks(tag, size):
        digest.update(chunk)
    return digest.digest()


def echo_payload(number):
    """Tunnel ``number``'s own 64 KiB for the concurrency test."""
    return struct.pack("!II", TAG_ECHO, number) + RANDOM_BLOCK[8:ECHO_PAYLOAD]


def recv_exact(sock, size):
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(data), size))
        data += chunk
    return bytes(data)


def recv_hashed(sock, size, buffer):
    """Receive exactly ``size`` bytes into ``buffer`` (reused), returning their SHA-256."""
    digest = hashlib.sha256()
    view = memoryview(buffer)
    left = size
    while left:
        got = sock.recv_into(view, min(left, len(view)))
        if not got:
            raise ConnectionError("closed with %d of %d bytes missing" % (left, size))
        digest.update(view[:got])
        left -= got
    return digest.digest()


def send_stream(sock, tag, size):
    for chunk in chunks(tag, size):
        sock.sendall(chunk)


def wait_eof(sock):
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


# --- The sink / echo service (a separate process: `bench.py _sink`) ------------------
#
# Each connection starts with HEADER (mode, size), then:
#   b"UP  "  the sink receives `size` bytes and answers their SHA-256 (32 bytes);
#   b"DOWN"  the sink sends the stream TAG_DOWN of `size` bytes;
#   b"BOTH"  both at once: sends TAG_DOWN while receiving, then the received SHA-256;
#   b"ECHO"  the sink echoes everything until EOF.
# It then waits for the generator to close: obfs4proxy has no half-close, so nobody
# closes before the other side has read everything.
# A connection that starts with "GET " comes through nginx with no webtunnel server
# behind it (nginx-upgrade): the sink answers the upgrade with webtunnel's 101 first.

SWITCHING_PROTOCOLS = (b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
                       b"Upgrade: websocket\r\n\r\n")


def read_header(conn):
    """HEADER's (mode, size), after answering an HTTP upgrade if the connection has one."""
    start = recv_exact(conn, 4)
    if start == b"GET ":
        head = start
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk or len(head) > 16384:
                raise ConnectionError("not an upgrade request")
            head += chunk
        conn.sendall(SWITCHING_PROTOCOLS)
        start = head.partition(b"\r\n\r\n")[2]  # the generator sends nothing before the 101
    return HEADER.unpack(start + recv_exact(conn, HEADER.size - len(start)))


def sink_serve(conn):
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(SOCKET_TIMEOUT * 2)
        mode, size = read_header(conn)
        if mode == b"ECHO":
            buffer = bytearray(ECHO_PAYLOAD)    # small: 1,000 of these run at once
            view = memoryview(buffer)
            while True:
                got = conn.recv_into(view)
                if not got:
                    return
                conn.sendall(view[:got])
        elif mode == b"UP  ":
            conn.sendall(recv_hashed(conn, size, bytearray(BLOCK)))
        elif mode == b"DOWN":
            send_stream(conn, TAG_DOWN, size)
        elif mode == b"BOTH":
            sender = threading.Thread(target=send_stream, args=(conn, TAG_DOWN, size), daemon=True)
            sender.start()
            digest = recv_hashed(conn, size, bytearray(BLOCK))
            sender.join()
            conn.sendall(digest)
        else:
            return
        wait_eof(conn)
    except OSError:
        pass
    finally:
        conn.close()


def sink_main():
    """Serve each connection on a thread, reusing idle ones: starting a thread per
    connection put about a millisecond of the sink's own latency (and its noise) into
    every sequential setup measured through it."""
    threading.stack_size(256 * 1024)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    print("SINK %s:%d" % listener.getsockname(), flush=True)

    def exit_on_stdin_eof():
        sys.stdin.read()
        os._exit(0)
    threading.Thread(target=exit_on_stdin_eof, daemon=True).start()
    jobs, idle, lock = queue.SimpleQueue(), [0], threading.Lock()

    def worker(conn):
        while True:
            sink_serve(conn)
            with lock:
                idle[0] += 1
            conn = jobs.get()

    while True:
        conn, _ = listener.accept()
        with lock:
            reuse = idle[0] > 0
            if reuse:
                idle[0] -= 1
        if reuse:
            jobs.put(conn)
        else:
            threading.Thread(target=worker, args=(conn,), daemon=True).start()
