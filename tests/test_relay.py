"""proxy.relay in this process, on real sockets."""

import socket
import struct
import sys
import threading
import time

import pytest
from support import IN_CI, recv_exact

import proxy
import transports


def can_inject():
    if not sys.platform.startswith("linux"):
        return "raw ICMP injection on loopback is written for Linux"
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800)).close()
    except (OSError, AttributeError) as exc:
        return "needs raw sockets (root): %s" % exc
    return None


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def connected_pair():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    return near, far


def test_a_transient_icmp_error_does_not_end_a_tunnel():
    """Linux's SO_ERROR also reports "soft" errors (an ICMP host unreachable
    quoting an established connection), which TCP itself rides out. The relay
    looks at SO_ERROR on a socket it does not watch (here: the application
    half-closed); it must not take such an error for a reset."""
    reason = can_inject()
    if reason:
        if IN_CI:
            pytest.fail("CI runs as root and must run this test: " + reason)
        pytest.skip(reason)
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    sniffer.bind(("lo", 0))
    sniffer.settimeout(0.2)
    app, upstream = connected_pair()
    downstream, peer = connected_pair()
    ended = []

    def run():
        try:
            proxy.relay(upstream, downstream, transports.Dummy(True),
                        proxy.Tunnel(1, ("127.0.0.1", 1), proxy.KeyWork(), proxy.BufferPool()))
            ended.append(None)
        except OSError as exc:
            ended.append(exc)

    relay = threading.Thread(target=run, daemon=True)
    relay.start()
    try:
        app.sendall(b"request")
        app.shutdown(socket.SHUT_WR)                  # upstream is now watched for nothing
        peer.settimeout(5)
        assert recv_exact(peer, 7) == b"request" and peer.recv(1) == b""
        # The sequence number upstream sends next, from its latest segment to
        # the application (its ACK of the FIN; not the SYN-ACK, whose number is
        # out of the window, so the kernel would ignore the ICMP).
        ports = (upstream.getsockname()[1], app.getsockname()[1])
        seq, end = None, time.monotonic() + 0.5
        while time.monotonic() < end:
            try:
                frame = sniffer.recv(65535)
            except socket.timeout:
                continue
            ip = frame[14:]
            if ip[9] != 6:
                continue
            tcp = ip[(ip[0] & 15) * 4:]
            if struct.unpack("!HH", tcp[:4]) == ports and not tcp[13] & 0x02:  # not SYN
                seq = struct.unpack("!I", tcp[4:8])[0]
        assert seq is not None, "saw no segment from upstream to the application"
        # ICMP type 3 code 1 (host unreachable) quoting a segment upstream -> app.
        inner = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0, 64, 6, 0,
                            socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.1"))
        inner += struct.pack("!HHI", ports[0], ports[1], seq)
        body = struct.pack("!BBHI", 3, 1, 0, 0) + inner
        body = body[:2] + struct.pack("!H", checksum(body)) + body[4:]
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as raw:
            raw.sendto(body, ("127.0.0.1", 0))
        relay.join(proxy.IDLE_CHECK * 2.5)       # the relay looks, and must carry on
        assert not ended, "the relay ended on a transient ICMP error: %r" % ended
        peer.sendall(b"response")
        peer.shutdown(socket.SHUT_WR)
        app.settimeout(5)
        assert recv_exact(app, 8) == b"response"
        relay.join(5)
        assert ended == [None]
    finally:
        for sock in (sniffer, app, upstream, downstream, peer):
            sock.close()
