"""What an operator or a learner is told, where shared/findings/newcomer-4.md
found it missing or wrong: a stop that cut live tunnels says how many; a port
below 1024 refused for want of privilege says what grants it; the obfs3 demo
names g^y for the server's public value.
"""

import errno
import signal
import socket
import subprocess
import sys

import pytest
from support import PROGRAM, ROOT, EchoServer, Program, echo_round_trip, fmt, socks5_connect

import process_setup

POSIX_SIGNALS = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
WAIT = 30


# --- A stop that cuts live tunnels says so ----------------------------------------------

@POSIX_SIGNALS
@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT]],
                         ids=["SIGTERM", "SIGINT twice"])
def test_a_stop_says_how_many_live_tunnels_it_reset(signals):
    with EchoServer() as echo, \
            Program("server", "--transport=dummy", "--dest=" + fmt(echo.address), "127.0.0.1:0") as server, \
            Program("client", "--transport=dummy", "127.0.0.1:0") as client:
        tunnels = [socks5_connect(client.address, server.address, timeout=WAIT) for _ in range(2)]
        try:
            for sock in tunnels:
                assert echo_round_trip(sock, b"live") == b"live"
            client.process.send_signal(signals[0])
            if len(signals) > 1:     # the first SIGINT waits for the tunnels; the second cuts them
                client.log.wait_for(r"stopped accepting; waiting for 2 live connection", timeout=WAIT)
                client.process.send_signal(signals[1])
            client.log.wait_for(r"stopping now: 2 live tunnel\(s\) reset", timeout=WAIT)
            client.log.wait_for(r"client stopped", timeout=WAIT)
        finally:
            for sock in tunnels:
                sock.close()


@POSIX_SIGNALS
def test_a_stop_with_nothing_live_says_nothing_of_resets():
    with EchoServer() as echo, \
            Program("client", "--transport=dummy", "--log-min-severity=info", "127.0.0.1:0") as client:
        # One tunnel served and ended (its relay gone from the pump once its "closed
        # after" line is said): the signal handlers are in place by then (they are
        # installed after the "listening on" line).
        with socks5_connect(client.address, echo.address, timeout=WAIT) as sock:
            assert echo_round_trip(sock, b"done") == b"done"
        client.log.wait_for(r"closed after", timeout=WAIT)
        client.process.send_signal(signal.SIGTERM)
        client.log.wait_for(r"client stopped", timeout=WAIT)
    assert not [line for line in client.log.lines if "reset" in line], client.log.lines


# --- A privileged port ----------------------------------------------------------------------

def refuse_bind(monkeypatch):
    def bind(self, address):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(socket.socket, "bind", bind)


@pytest.mark.skipif(sys.platform == "win32", reason="ports below 1024 are privileged on POSIX")
def test_permission_denied_below_1024_names_what_grants_it(monkeypatch):
    """As the README says in prose: root, or CAP_NET_BIND_SERVICE (the bind is
    refused by a stand-in, since the tests may run as root)."""
    refuse_bind(monkeypatch)
    with pytest.raises(PermissionError) as caught:
        process_setup.listen(("127.0.0.1", 443))
    assert caught.value.strerror == ("Permission denied (ports below 1024 need root or the "
                                     "CAP_NET_BIND_SERVICE capability)")
    assert caught.value.errno == errno.EACCES


def test_permission_denied_elsewhere_is_left_as_it_is(monkeypatch):
    refuse_bind(monkeypatch)
    with pytest.raises(PermissionError) as caught:
        process_setup.listen(("127.0.0.1", 4430))
    assert caught.value.strerror == "Permission denied"


# --- The obfs3 demo: the server sends g^y ----------------------------------------------------

def test_the_obfs3_demo_names_each_sides_exponent():
    shown = subprocess.run([sys.executable, PROGRAM, "demo", "--transport=obfs3"], cwd=str(ROOT),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr
    line = next(line for line in shown.stdout.splitlines() if "Here X is" in line)
    x_part, y_part = line.split("Here X is", 1)[1].split(", Y is")
    assert "g^x was sent" in x_part and "g^y" not in x_part, line
    assert "g^y was sent" in y_part and "g^x" not in y_part, line
