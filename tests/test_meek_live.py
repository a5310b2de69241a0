"""meek end to end, with real parts: our server as a process behind nginx (TLS at nginx,
plain HTTP to us, keep-alive connections that carry requests of many sessions) or
terminating TLS itself (tls-cert=), obfs4proxy's meek_lite client as the independent
peer, our own client in each of its modes, and Tor's Extended ORPort (fake_tor).

    application --SOCKS--> client ==TLS, POSTs==> nginx --HTTP keep-alive--> our server
        --one connection per session--> destination (or the Extended ORPort)

The clients trust the test CA (tests/testca.py) through SSL_CERT_FILE (obfs4proxy's Go
crypto/tls honours it too). Synchronisation is on real events (a port that accepts, a
destination's accept or end of stream, a log line), never on sleeps.
"""

import contextlib
import hashlib
import os
import random
import re
import socket
import ssl
import threading
import time

import pytest
import testca
from fake_tor import ExtORPort, ManagedPT, client_env, server_env, write_cookie
from nginx import MEEK_SERVER_BLOCK, Nginx, free_port, require_nginx
from peers import Obfs4proxy
from support import (
    OURS,
    EchoServer,
    Program,
    SocksReplyError,
    bootstrap,
    echo_round_trip,
    fmt,
    recv_all,
    socks5_connect,
)

PATH = "/meek/"
NAME = testca.NAME
PLACEHOLDER = ("192.0.2.3", 2)          # the bridge line's address: never dialled
FINGERPRINT = "0123456789ABCDEF0123456789ABCDEF01234567"


def payload(size, seed):
    return random.Random(seed).getrandbits(8 * size).to_bytes(size, "little")


def sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def parts(tmp_path, ca):
    require_nginx()
    started = Parts(tmp_path, ca)
    try:
        yield started
    finally:
        started.close()


class Parts:
    """Everything a test starts, stopped at the end in reverse order; their logs are
    printed then (pytest shows them when a test fails)."""

    def __init__(self, tmp_path, ca):
        self.tmp_path, self.ca = tmp_path, ca
        self.stack = contextlib.ExitStack()
        self.logs = []

    def close(self):
        self.stack.close()
        for label, lines in self.logs:
            print("--- %s" % label)
            print("\n".join(lines()))

    def env(self):
        return dict(os.environ, SSL_CERT_FILE=self.ca.ca_file)

    def dest(self, behaviour=None):
        return self.stack.enter_context(EchoServer(behaviour=behaviour))

    def program(self, label, *args, env=None):
        program = self.stack.enter_context(Program(*args, env=env))
        self.logs.append((label, lambda: program.log.lines))
        return program

    def server(self, dest, options="", *extra):
        args = ["server", "--transport=meek", "--dest=" + fmt(dest.address), "127.0.0.1:0"]
        if options:
            args.append("--transport-options=" + options)
        return self.program("server", *(args + list(extra)))

    def nginx(self, backend):
        front = Nginx(self.tmp_path / "nginx", backend, self.ca.cert_file, self.ca.key_file,
                      path=PATH, block=MEEK_SERVER_BLOCK)
        self.stack.callback(front.stop)
        self.logs.append(("nginx error log", lambda: front.error_log().splitlines()))
        return front

    def bridge(self, behaviour=None, options=""):
        """(destination, server, nginx) with our server behind nginx."""
        dest = self.dest(behaviour)
        server = self.server(dest, options)
        return dest, server, self.nginx(server.address)

    def meek_lite(self):
        """obfs4proxy as a managed meek_lite client: its SOCKS5 address."""
        old = os.environ.get("SSL_CERT_FILE")
        os.environ["SSL_CERT_FILE"] = self.ca.ca_file
        try:
            peer = Obfs4proxy("client", self.tmp_path, transport="meek_lite")
        finally:
            if old is None:
                del os.environ["SSL_CERT_FILE"]
            else:
                os.environ["SSL_CERT_FILE"] = old
        self.stack.callback(peer.stop)
        self.logs.append(("obfs4proxy stderr", lambda: peer.stderr.lines))
        return peer.address

    def managed(self, env, *args, label="managed"):
        pt = self.stack.enter_context(ManagedPT(env, *args))
        self.logs.append((label + " stderr", lambda: pt.stderr.lines))
        return pt


def url_of(front, host=NAME):
    """url= with the test certificate's name, and front= that dials nginx by address."""
    return "https://%s%s" % (host, PATH), "127.0.0.1:%d" % front.address[1]


def args_of(front):
    url, dial = url_of(front)
    return "url=%s;front=%s" % (url, dial)


# --- obfs4proxy's meek_lite client, through nginx, to our server ------------------------

def test_meek_lite_through_nginx_carries_megabytes_exact_both_ways(parts):
    """4 MiB echoed: obfs4proxy's client (Go's net/http and crypto/tls) -> nginx -> our
    server -> the destination and back, SHA-256 equal; one session, one destination
    connection."""
    dest, _, front = parts.bridge()
    socks = parts.meek_lite()
    data = payload(4 << 20, seed=1)
    with socks5_connect(socks, PLACEHOLDER, args=args_of(front)) as sock:
        assert sha(echo_round_trip(sock, data)) == sha(data)
    assert dest.accepted == 1
