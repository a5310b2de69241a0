"""A real Tor client bootstraps through a real Tor bridge, with our program as the
pluggable transport on one side or both (tests/tor-loopback.sh, loopback only).

    tor client --SOCKS--> [client PT] ==T==> [server PT] --Extended ORPort--> tor bridge

Success means the client fetched the bridge's descriptor through the transport: Tor's
TLS and a directory request crossed the obfuscated link, and on the bridge side our
server authenticated to Tor's Extended ORPort (the script reports "ExtORPort auth ok"
from the bridge's debug log). For obfs4 the script reads cert= and iat-mode= from the
bridge's pt_state/obfs4_bridgeline.txt, the file our server (or obfs4proxy) wrote.

The script, not this module, writes the torrcs; both name a fake loopback directory
authority and no fallbacks, so Tor contacts no public address. Every test is slow
(a few seconds each; the wrong-cert control waits for the script's 30 s limit).
"""

import re
import shutil

import pytest
from support import OURS, bootstrap, load_vectors, require_obfs4proxy

pytestmark = [pytest.mark.slow, pytest.mark.interop]

SUCCESS = re.compile(r"^tor bootstrap through (\S+): client got the bridge descriptor "
                     r"\((.*)\) \[(/tmp/torbs\.\w+)\]$", re.MULTILINE)
FAILED = re.compile(r"^tor bootstrap through (\S+): FAILED(.*)\[(/tmp/torbs\.\w+)\]$", re.MULTILINE)


def assert_bootstrapped(client_pt, server_pt, transport, label):
    status, output, seconds = bootstrap(client_pt, server_pt, transport)
    print("\n%s: tor bootstrap in %.1f s: %s" % (label, seconds, output.strip().splitlines()[-1]))
    match = SUCCESS.search(output)
    assert status == 0 and match, "exit status %d:\n%s" % (status, output)
    assert match.group(1) == transport
    details = match.group(2)
    assert "ExtORPort auth ok" in details, details   # the bridge-side PT used the Extended ORPort
    if transport == "obfs4":
        assert "bridge line args: iat-mode=0" in details, details
    shutil.rmtree(match.group(3), ignore_errors=True)   # kept only when a run fails


def obfs4proxy():
    return require_obfs4proxy()


def test_obfs4_ours_with_ours():
    assert_bootstrapped(OURS, OURS, "obfs4", "obfs4 our client, our bridge")


def test_obfs4_our_client_obfs4proxy_bridge():
    assert_bootstrapped(OURS, obfs4proxy(), "obfs4", "obfs4 our client, obfs4proxy bridge")


def test_obfs4_obfs4proxy_client_our_bridge():
    assert_bootstrapped(obfs4proxy(), OURS, "obfs4", "obfs4 obfs4proxy client, our bridge")


def test_obfs3_ours_with_ours():
    assert_bootstrapped(OURS, OURS, "obfs3", "obfs3 our client, our bridge")


def test_obfs3_our_client_obfs4proxy_bridge():
    assert_bootstrapped(OURS, obfs4proxy(), "obfs3", "obfs3 our client, obfs4proxy bridge")


def test_obfs3_obfs4proxy_client_our_bridge():
    assert_bootstrapped(obfs4proxy(), OURS, "obfs3", "obfs3 obfs4proxy client, our bridge")


def test_obfs2_ours_with_ours():
    assert_bootstrapped(OURS, OURS, "obfs2", "obfs2 our client, our bridge")


def test_wrong_cert_fails_the_bootstrap():
    """The control: the same run with another bridge's cert on the Bridge line must
    fail (our bridge stays silent), so the success lines above mean something."""
    other = load_vectors("obfs4-server-state.json")["generated_identity"]["stdout"][2]
    cert = re.search(r"cert=(\S+),", other).group(1)
    status, output, seconds = bootstrap(OURS, OURS, "obfs4", BRIDGE_ARGS="cert=%s iat-mode=0" % cert)
    print("\nobfs4 with a wrong cert: %.1f s, exit status %d" % (seconds, status))
    assert status == 1 and FAILED.search(output) and not SUCCESS.search(output), output
    shutil.rmtree(FAILED.search(output).group(3), ignore_errors=True)
