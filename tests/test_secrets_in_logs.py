"""Safe logging, checked where it breaks: no secret value in any message.

Recognisable secrets (an obfs2 shared-secret, obfs4 private-key, node-id,
public-key and cert values, a webtunnel url= path, a SOCKS target host name)
are fed through every error path a user or a prober can reach:

- malformed SOCKS arguments and host names, to SOCKS clients of obfs2, obfs4
  and webtunnel, by hand and under managed mode;
- bad transport options at start-up (command line, a bridge line, an obfs4
  state file) and in Tor's environment (TOR_PT_SERVER_TRANSPORT_OPTIONS);
- a wrong obfs4 cert=.

Then everything that was logged is searched: our stderr at debug (every
level), the managed-mode log file, every line on Tor's stdout (LOG lines,
ENV-ERROR, SMETHOD-ERROR). Each case also checks that its path was reached
(the refusal was said), so a message that disappeared cannot pass for a clean
one. A transport's own parsing of its values (webtunnel's url=) is its
module's business; here its values only cross the shared parsers.
"""

import json
import socket
import struct
import subprocess
import sys

import pytest
from fake_tor import ManagedPT, client_env, server_env
from support import PROGRAM, ROOT, EchoServer, Program, fmt, recv_all

WAIT = 30

# The secrets, each with a core that must never appear anywhere (a truncated
# echo counts as one).
SHARED_SECRET = "ShHhObfs2SecretValue"
PRIVATE_KEY = "c0ffee15dec0deba5e" + "0" * 45 + " "      # 64 characters, the last not hex
NODE_ID = "feedface0ddba11f" + "1" * 22 + "zz"            # 40 characters, not hex at the end
PUBLIC_KEY = "5ca1ab1e5ca1ab1e" + "2" * 46 + "q"           # 63: neither hex nor even
CERT = "TopSecretCertValue" + "A" * 52                     # 70 base64 characters: a wrong cert
SHORT_CERT = CERT[:69]                                     # malformed: 69 characters
URL_PATH = "WtSecretPathValue"
HOST = "hostsecretname"
PROXY_PASSWORD = "PrxPassSecret"
CORES = [SHARED_SECRET[4:16], "c0ffee15dec0de", "feedface0ddba11f", "5ca1ab1e5ca1ab1e",
         "TopSecretCert", URL_PATH[2:14], HOST, PROXY_PASSWORD[:7]]
# Outgoing proxies whose URI is refused, with the password where a URL parser would
# have taken it for the port, or with no port at all.
BAD_PROXIES = [uri % PROXY_PASSWORD for uri in ("socks5://alice:%s/x@127.0.0.1", "http://bob:%s#x@127.0.0.1:0",
                                                "socks5://alice:%s?x")]
GOOD_NODE_ID, GOOD_KEY, GOOD_SEED = "0123456789" * 4, "ab" * 32, "cd" * 24


def leaks(lines):
    """The lines that show a secret's core."""
    return [line for line in lines if any(core in line for core in CORES)]


def assert_clean(lines, where):
    found = leaks(lines)
    assert not found, "secret values in %s:\n%s" % (where, "\n".join(found))


# --- SOCKS messages carrying the secrets -------------------------------------------------

def socks5_with_args(args, host="127.0.0.1", port=80):
    """VER=05 NMETHODS=01 METHODS=[02]; VER=01 ULEN UNAME PLEN=01 PASSWD=00; CONNECT."""
    return b"\x05\x01\x02" + bytes([1, len(args)]) + args + b"\x01\x00" + socks5_connect(host, port)


def socks5_connect(host, port):
    """VER=05 CMD=01 RSV=00 ATYP=01 (IPv4) or 03 (name) DST.ADDR DST.PORT."""
    try:
        address = b"\x01" + socket.inet_aton(host)
    except (OSError, TypeError):
        name = host if isinstance(host, bytes) else host.encode()
        address = b"\x03" + bytes([len(name)]) + name
    return b"\x05\x01\x00" + address + struct.pack("!H", port)


def socks4_with_userid(userid, host=None):
    """VN=04 CD=01 DSTPORT DSTIP USERID 00 [HOST 00] (SOCKS4a when a host is given)."""
    ip = b"\0\0\0\x01" if host is not None else socket.inet_aton("127.0.0.1")
    return b"\x04\x01\x00\x50" + ip + userid + b"\0" + (host + b"\0" if host is not None else b"")


SOCKS_CASES = {
    # pt-spec 3.5 arguments the parser refuses (obfs2's shared-secret)
    "stray ;": socks5_with_args(b"shared-secret=%s;" % SHARED_SECRET.encode()),
    "double ;": socks5_with_args(b"shared-secret=%s;;ss-hash-iterations=1" % SHARED_SECRET.encode()),
    "lone backslash": socks5_with_args(b"shared-secret=%s\\" % SHARED_SECRET.encode()),
    "no =": socks5_with_args(SHARED_SECRET.encode()),
    "empty key": socks5_with_args(b"=" + SHARED_SECRET.encode()),
    "not UTF-8": socks5_with_args(b"shared-secret=%s\xff" % SHARED_SECRET.encode()),
    "SOCKS4 stray ;": socks4_with_userid(b"shared-secret=%s;" % SHARED_SECRET.encode()),
    "SOCKS4 no =": socks4_with_userid(SHARED_SECRET.encode()),
    # the transports' own checks of well-formed arguments
    "unknown argument": socks5_with_args(b"shared-secret=%s;bogus=1" % SHARED_SECRET.encode()),
    "node-id not hex": socks5_with_args(b"node-id=%s;public-key=%s;iat-mode=0"
                                        % (NODE_ID.encode(), GOOD_KEY.encode())),
    "public-key not hex": socks5_with_args(b"node-id=%s;public-key=%s;iat-mode=0"
                                           % (GOOD_NODE_ID.encode(), PUBLIC_KEY.encode())),
    "cert malformed": socks5_with_args(b"cert=%s;iat-mode=0" % SHORT_CERT.encode()),
    "cert stray ;": socks5_with_args(b"cert=%s;iat-mode=0;" % CERT.encode()),
    # webtunnel's url= crossing the shared parser
    "url stray ;": socks5_with_args(b"url=https://example.org/%s;" % URL_PATH.encode()),
    "url lone backslash": socks5_with_args(b"url=https://example.org/%s\\" % URL_PATH.encode()),
    "url no =": socks5_with_args(b"url=https://example.org/%s;servername" % URL_PATH.encode()),
    # target host names that cannot be one
    "SOCKS5 name": b"\x05\x01\x00" + socks5_connect(HOST + ".example.org/x", 80),
    "SOCKS5 name not UTF-8": b"\x05\x01\x00" + socks5_connect(HOST.encode() + b"\xff", 80),
    "SOCKS4a name": socks4_with_userid(b"", host=HOST.encode() + b" x"),
}


def refuse(address, data):
    """Send one SOCKS conversation that must be refused; True when it was (the
    reply is never a CONNECT success)."""
    with socket.create_connection(address, timeout=WAIT) as sock:
        try:
            sock.sendall(data)
            answer = recv_all(sock)
        except ConnectionResetError:
            return True
    return b"\x05\x00\x00" not in answer and b"\x00\x5a" not in answer


def feed_socks_cases(address, log_lines, wait_for):
    """Every SOCKS case to the client at ``address``; each must be refused and said."""
    for number, (case, data) in enumerate(SOCKS_CASES.items(), 1):
        assert refuse(address, data), case
        wait_for(r"conn %d \(" % number)


@pytest.mark.parametrize("transport", ["obfs2", "obfs4", "webtunnel"])
def test_socks_clients_never_log_a_secret(transport):
    with Program("client", "--transport=" + transport, "--log-min-severity=debug",
                 "127.0.0.1:0") as client:
        feed_socks_cases(client.address, client.log.lines, client.log.wait_for)
    assert len([line for line in client.log.lines if "SOCKS:" in line or "arguments" in line]) \
        >= len(SOCKS_CASES), client.log.lines     # each refusal was said
    assert_clean(client.log.lines, "the %s client's log" % transport)


def test_managed_clients_never_log_a_secret_to_tor_or_to_the_log(tmp_path):
    env = client_env(tmp_path, transports="obfs2,obfs4,webtunnel")
    with ManagedPT(env, "--log-min-severity=debug") as tor:
        for name in ("obfs2", "obfs4", "webtunnel"):
            for data in SOCKS_CASES.values():
                assert refuse(tor.cmethods[name], data)
        # Tor's LOG lines for those failures: wait for the last transport's.
        tor.stdout.wait_for(r'^LOG SEVERITY=notice MESSAGE=".*SOCKS: ', timeout=WAIT)
    log_file = (tmp_path / "client-state" / "obfsproxy.log").read_text(encoding="utf-8").splitlines()
    assert any("bad per-connection arguments" in line for line in log_file), log_file[-20:]
    assert any(line.startswith("LOG ") for line in tor.stdout.lines), tor.stdout.lines
    assert_clean(tor.stdout.lines, "Tor's stdout")
    assert_clean(tor.stderr.lines, "stderr")
    assert_clean(log_file, "the managed log file")


# --- Start-up: the command line, a bridge line, a state file ---------------------------------

def run_cli(*args):
    return subprocess.run([sys.executable, PROGRAM, *args], cwd=str(ROOT), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def obfs4_options(private_key):
    return "node-id=%s;private-key=%s;drbg-seed=%s" % (GOOD_NODE_ID, private_key, GOOD_SEED)


STARTUP_CASES = {
    "obfs2 server, stray ;": ["server", "--transport=obfs2", "--dest=127.0.0.1:1",
                              "--transport-options=shared-secret=%s;" % SHARED_SECRET],
    "obfs2 server, lone backslash": ["server", "--transport=obfs2", "--dest=127.0.0.1:1",
                                     "--transport-options=shared-secret=%s\\" % SHARED_SECRET],
    "obfs2 client, no =": ["client", "--transport=obfs2", "--transport-options=" + SHARED_SECRET],
    "obfs4 server, private-key": ["server", "--transport=obfs4", "--state-dir={state}",
                                  "--dest=127.0.0.1:1", "--transport-options=" + obfs4_options(PRIVATE_KEY)],
    "obfs4 bridge line, node-id": ["client", "--bridge=obfs4 127.0.0.1:1 node-id=%s public-key=%s "
                                   "iat-mode=0" % (NODE_ID, GOOD_KEY)],
    "obfs4 bridge line, short cert": ["client", "--bridge=obfs4 127.0.0.1:1 cert=%s iat-mode=0" % SHORT_CERT],
    "obfs4 SOCKS defaults, public-key": ["client", "--transport=obfs4", "--transport-options=node-id=%s;"
                                         "public-key=%s;iat-mode=0" % (GOOD_NODE_ID, PUBLIC_KEY)],
    "webtunnel, stray ;": ["client", "--transport=webtunnel",
                           "--transport-options=url=https://example.org/%s;" % URL_PATH],
}
STARTUP_CASES.update(("--proxy %d" % number, ["client", "--transport=obfs2", "--proxy=" + uri])
                     for number, uri in enumerate(BAD_PROXIES, 1))


@pytest.mark.parametrize("case", list(STARTUP_CASES))
def test_startup_errors_never_show_a_secret(case, tmp_path):
    args = [arg.format(state=tmp_path / "state") for arg in STARTUP_CASES[case]]
    done = run_cli(*args, "127.0.0.1:0")
    assert done.returncode == 2, done.stderr          # refused, with its one line
    assert_clean(done.stderr.splitlines() + done.stdout.splitlines(), "the error")


def test_a_bad_private_key_in_the_state_file_is_not_shown(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "obfs4_state.json").write_text(json.dumps({
        "node-id": GOOD_NODE_ID, "private-key": PRIVATE_KEY, "public-key": "",
        "drbg-seed": GOOD_SEED, "iat-mode": 0}), encoding="utf-8")
    done = run_cli("server", "--transport=obfs4", "--state-dir=%s" % state, "--dest=127.0.0.1:1",
                   "127.0.0.1:0")
    assert done.returncode == 2 and "private-key" in done.stderr, done.stderr
    assert_clean(done.stderr.splitlines(), "the error")


# --- Tor's environment: TOR_PT_SERVER_TRANSPORT_OPTIONS --------------------------------------

ENV_CASES = {
    "lone backslash": ("obfs2", "obfs2:shared-secret=%s\\" % SHARED_SECRET, "ENV-ERROR"),
    "no =": ("obfs2", "obfs2:%s" % SHARED_SECRET, "ENV-ERROR"),
    "no transport": ("obfs2", "shared-secret=%s" % SHARED_SECRET, "ENV-ERROR"),
    "unknown option": ("obfs2", "obfs2:shared-secret=%s;obfs2:bogus=1" % SHARED_SECRET, "SMETHOD-ERROR"),
    "private-key": ("obfs4", ";".join("obfs4:" + o for o in obfs4_options(PRIVATE_KEY).split(";")),
                    "SMETHOD-ERROR"),
    "webtunnel unknown option": ("webtunnel", "webtunnel:url=https://example.org/%s;webtunnel:bogus=1"
                                 % URL_PATH, "SMETHOD-ERROR"),
}


@pytest.mark.parametrize("case", list(ENV_CASES))
def test_managed_server_options_never_reach_a_log(case, tmp_path):
    name, options, keyword = ENV_CASES[case]
    env = server_env(tmp_path, ("127.0.0.1", 1), transports=name, SERVER_TRANSPORT_OPTIONS=options)
    with ManagedPT(env, "--log-min-severity=debug") as tor:
        assert keyword in tor.keywords(), tor.stdout.lines
        tor.wait()
    log_path = tmp_path / "server-state" / "obfsproxy.log"
    log_file = log_path.read_text(encoding="utf-8").splitlines() if log_path.exists() else []
    assert_clean(tor.stdout.lines, "Tor's stdout")
    assert_clean(tor.stderr.lines, "stderr")
    assert_clean(log_file, "the managed log file")


@pytest.mark.parametrize("uri", BAD_PROXIES)
def test_a_bad_tor_pt_proxy_never_shows_its_password(uri, tmp_path):
    env = client_env(tmp_path, "obfs2", PROXY=uri)
    with ManagedPT(env, "--log-min-severity=debug") as tor:
        assert tor.keywords() == ["VERSION", "PROXY-ERROR"], tor.stdout.lines
        assert tor.wait() == 1
    log_path = tmp_path / "client-state" / "obfsproxy.log"
    log_file = log_path.read_text(encoding="utf-8").splitlines() if log_path.exists() else []
    assert_clean(tor.stdout.lines + tor.stderr.lines + log_file, "Tor's stdout, stderr or the log")


# --- A wrong cert= ----------------------------------------------------------------------

def test_a_wrong_cert_is_not_shown_by_either_side(tmp_path):
    with EchoServer() as echo, \
            Program("server", "--transport=obfs4", "--state-dir=%s" % (tmp_path / "state"),
                    "--dest=" + fmt(echo.address), "--log-min-severity=debug", "127.0.0.1:0") as server:
        bridge = "obfs4 %s cert=%s iat-mode=0" % (fmt(server.address), CERT)
        with Program("client", "--bridge=" + bridge, "--handshake-timeout=2",
                     "--log-min-severity=debug", "127.0.0.1:0") as client:
            with socket.create_connection(client.address, timeout=WAIT) as sock:
                sock.sendall(b"hello")
                client.log.wait_for(r"obfs4 handshake with the bridge .* failed", timeout=WAIT)
        with Program("client", "--transport=obfs4", "--handshake-timeout=2",
                     "--log-min-severity=debug", "127.0.0.1:0") as socks_client:
            args = b"cert=%s;iat-mode=0" % CERT.encode()
            assert refuse(socks_client.address, socks5_with_args(args, *server.address))
            socks_client.log.wait_for(r"obfs4 handshake with the bridge .* failed", timeout=WAIT)
    assert_clean(client.log.lines, "the client's log")
    assert_clean(socks_client.log.lines, "the SOCKS client's log")
    assert_clean(server.log.lines, "the bridge's log")


# --- webtunnel's url= path: the bridge's bearer token ----------------------------------

WT_URL = "https://example.org/%s" % URL_PATH
MALFORMED_LINES = ("GET /%s HTTP/1.1 " % URL_PATH,     # a trailing space
                   "GET /%s HTTP/2.0" % URL_PATH,      # not HTTP/1.x
                   "GET /%s" % URL_PATH,               # no version
                   "GET /wrong-path HTTP/1.1")         # a path mismatch


def test_a_webtunnel_server_never_logs_its_path():
    """The bridge line said at NOTICE (url= is a secret option), and request lines that are
    slightly off (which may carry the path): each refusal said, none quoting it."""
    with Program("server", "--transport=webtunnel", "--transport-options=url=" + WT_URL,
                 "--dest=127.0.0.1:1", "--log-min-severity=debug", "127.0.0.1:0") as server:
        line = server.log.wait_for(r"bridge line for clients: (.*)$").group(1)
        assert "url=<as given>" in line, line
        for number, request in enumerate(MALFORMED_LINES, 1):
            with socket.create_connection(server.address, timeout=WAIT) as sock:
                sock.sendall(request.encode() + b"\r\nHost: example.org\r\nConnection: Upgrade\r\n"
                             b"Upgrade: websocket\r\n\r\n")
                assert recv_all(sock).startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 404 "))
            server.log.wait_for(r"conn %d \(.*not webtunnel" % number, timeout=WAIT)
    assert_clean(server.log.lines, "the webtunnel server's log")


def test_a_managed_webtunnel_server_never_logs_its_path(tmp_path):
    """Tor must get url= in SMETHOD's ARGS; the debug log's copy of that line must not."""
    env = server_env(tmp_path, ("127.0.0.1", 1), transports="webtunnel",
                     SERVER_TRANSPORT_OPTIONS="webtunnel:url=" + WT_URL)
    with ManagedPT(env, "--log-min-severity=debug") as tor:
        assert tor.args("webtunnel")["url"] == WT_URL
    log_file = (tmp_path / "server-state" / "obfsproxy.log").read_text(encoding="utf-8").splitlines()
    assert any("to Tor: SMETHOD webtunnel" in line for line in log_file), log_file[-20:]
    assert_clean(log_file, "the managed log file")
    assert_clean(tor.stderr.lines, "stderr")
