"""TOR_PT_OUTBOUND_BIND_ADDRESS_V4/_V6: the source address of outgoing
connections, never used for loopback destinations (as Tor's own
OutboundBindAddress). Only loopback exists here, so the binding itself is
shown by calling obfsproxy.connect with the loopback exemption switched off."""

import socket

import pytest
from fake_tor import ManagedPT
from support import recv_exact, socks5_connect
from test_managed import client_env, managed_echo_server

import obfsproxy


def peer_of_one_connection(sources):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with obfsproxy.connect(listener.getsockname(), 5, sources):
            conn, peer = listener.accept()
            conn.close()
    return peer[0]


def test_loopback_destinations_keep_the_default_source():
    assert peer_of_one_connection({socket.AF_INET: "127.0.0.2"}) == "127.0.0.1"
    assert peer_of_one_connection(None) == "127.0.0.1"


def test_other_destinations_get_the_source_of_their_family(monkeypatch):
    monkeypatch.setattr(obfsproxy, "is_loopback", lambda host: False)
    assert peer_of_one_connection({socket.AF_INET: "127.0.0.2"}) == "127.0.0.2"
    # An IPv6 source is not used for an IPv4 destination.
    assert peer_of_one_connection({socket.AF_INET6: "::1"}) == "127.0.0.1"


@pytest.mark.parametrize("variable, value", [
    ("OUTBOUND_BIND_ADDRESS_V4", "not-an-address"),
    ("OUTBOUND_BIND_ADDRESS_V4", "::1"),
    ("OUTBOUND_BIND_ADDRESS_V6", "127.0.0.1"),
])
def test_a_bad_bind_address_is_an_env_error(tmp_path, variable, value):
    with ManagedPT(client_env(tmp_path, **{variable: value})) as pt:
        assert pt.keywords() == ["VERSION", "ENV-ERROR"], pt.messages
        assert pt.process.wait(10) != 0


def test_managed_client_with_bind_addresses_still_tunnels(tmp_path):
    env = client_env(tmp_path, OUTBOUND_BIND_ADDRESS_V4="127.0.0.2",
                     OUTBOUND_BIND_ADDRESS_V6="[::1]")
    with managed_echo_server(tmp_path) as server, ManagedPT(env) as client:
        assert client.keywords() == ["VERSION", "CMETHOD", "CMETHODS DONE"], client.messages
        with socks5_connect(client.cmethods["obfs2"], server.smethods["obfs2"]) as sock:
            sock.sendall(b"through the bridge")
            assert recv_exact(sock, 18) == b"through the bridge"

