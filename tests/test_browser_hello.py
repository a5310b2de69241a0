"""The webtunnel client's browser route (browser_tls.py): the hello it sends, pinned by JA4;
the same tunnel on both routes through nginx with TLS 1.2 and 1.3; and the fall-back to
Python's ssl, said once at NOTICE, when curl_cffi is missing or fails its self-test.

curl_cffi is in requirements-dev.txt: in CI (CI=true) a missing curl_cffi fails the tests
that need it, elsewhere they are skipped, saying so. The JA4 values are written here as
literals, not read from browser_tls.TARGETS, so that a curl_cffi upgrade that changes the
hello fails here, and so does an edit of the pinned value that nobody meant.
"""

import gc
import os
import socket
import ssl
import threading

import nginx as nginx_module
import pytest
import testca
from nginx import Nginx, require_nginx
from support import EchoServer, Program, echo_round_trip, socks5_connect

import browser_tls
import tlswire
import webtunnel
from webtunnel import WebTunnel

IN_CI = os.environ.get("CI") == "true"
CHROME_WEBSOCKET_JA4 = "t13d1515h1_8daaf6152771_0a20fe35d3a5"   # Chrome opening a wss:// WebSocket
FIREFOX_H1_JA4 = "t13d1517h1_8daaf6152771_3cbfd9057e0d"
PATH = "/k7Qm2Zx1c1b00b6"
URL = "https://wt.test" + PATH


def require_browser_route():
    """Skip unless the browser route runs here; in CI, a browser route that is off
    (curl_cffi missing or failing its self-test) fails, unless OBFSPROXY_HELLO=python
    turned it off on purpose (CI's run on Python's ssl)."""
    available, why = browser_tls.route()
    if available:
        return
    if os.environ.get(browser_tls.HELLO_ENV, "").strip().lower() == "python":
        pytest.skip("%s=python: this test is about the browser route" % browser_tls.HELLO_ENV)
    if IN_CI:
        pytest.fail("the browser route is off in CI: %s" % why)
    pytest.skip("the browser route is off here (%s): pip install curl_cffi" % why)


# --- The hello ----------------------------------------------------------------------------------

@pytest.mark.parametrize("family, expected", [("chrome", CHROME_WEBSOCKET_JA4), ("firefox", FIREFOX_H1_JA4)])
def test_the_browser_hello_has_the_pinned_ja4(family, expected):
    require_browser_route()
    hello = tlswire.hello(browser_tls.first_flight(browser_tls.context(family), "wt.test"))
    assert hello is not None
    assert tlswire.ja4(hello) == expected
    assert hello.sni == "wt.test" and hello.alpn == [b"http/1.1"]


def test_the_python_hello_is_no_browsers():
    hello = tlswire.hello(browser_tls.first_flight(webtunnel.default_client_context(), "wt.test"))
    assert tlswire.ja4(hello) not in (CHROME_WEBSOCKET_JA4, FIREFOX_H1_JA4)
    assert hello.alpn == [b"http/1.1"]


def test_detect_and_the_demo_say_whose_hello_each_route_sends():
    """tlswire.whose, which detect prints under each ClientHello and the demo beside its JA4."""
    python = tlswire.hello(browser_tls.first_flight(webtunnel.default_client_context(), "wt.test"))
    words = tlswire.whose(python)      # OpenSSL's builds differ: known here, or not in the list
    assert words.startswith("no browser's: Python's ssl") or words.startswith("not in this tool's")
    require_browser_route()
    chrome = tlswire.hello(browser_tls.first_flight(browser_tls.context(), "wt.test"))
    assert tlswire.whose(chrome) == ("a browser's: Chrome opening a wss:// WebSocket (webtunnel's "
                                     "browser route)")


def test_our_client_process_sends_the_pinned_hello_on_the_wire():
    """The first bytes our client process writes to the web server, read by a bare TCP
    listener: the hello a censor sees, with Chrome's WebSocket JA4."""
    require_browser_route()
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, Program("client", "--transport=webtunnel", "127.0.0.1:0") as client:
        url = "https://127.0.0.1:%d%s" % (listener.getsockname()[1], PATH)
        result = {}

        def connect():
            try:
                socks5_connect(client.address, ("wt.test", 443), args="url=%s;servername=wt.test" % url)
            except Exception as exc:     # the handshake cannot finish: a SOCKS failure
                result["error"] = exc
        thread = threading.Thread(target=connect)
        thread.start()
        listener.settimeout(30)
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(30)
            first = b""
            while tlswire.hello(first) is None:
                data = conn.recv(65536)
                assert data, "the client closed before its hello was complete"
                first += data
        thread.join(60)
    assert tlswire.ja4(tlswire.hello(first)) == CHROME_WEBSOCKET_JA4
    assert tlswire.hello(first).sni == "wt.test"


# --- Every tunnel a full handshake, on the wire ------------------------------------------------

def _pipe(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class HelloRecorder(EchoServer):
    """A TCP relay in front of ``backend`` that keeps the ClientHello each connection
    starts with (``hellos``), as an observer on the path sees it, and passes every
    byte on both ways."""

    def __init__(self, backend):
        self.backend, self.hellos = backend, []
        EchoServer.__init__(self)

    def _serve(self, conn):
        with conn:
            conn.settimeout(30)
            first = b""
            while tlswire.hello(first) is None:
                data = conn.recv(65536)
                if not data:
                    return
                first += data
            self.hellos.append(tlswire.hello(first))
            with socket.create_connection(self.backend, timeout=30) as upstream:
                upstream.sendall(first)
                back = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
                back.start()
                _pipe(conn, upstream)
                back.join(30)


PRE_SHARED_KEY = 41      # the extension a resumed TLS 1.3 hello carries, its identity in clear


@pytest.mark.parametrize("route", ["browser", "python"])
def test_every_tunnel_is_a_full_handshake_with_the_pinned_hello(route, ca):
    """Tunnels one after another and then at once, each to a bridge that issues TLS 1.3
    session tickets (ours with tls-cert=, as nginx does): every ClientHello on the wire
    has no pre_shared_key (nothing links one tunnel to the next) and the route's JA4.
    The shared curl multi handle used to offer one ticket on every later tunnel."""
    if route == "browser":
        require_browser_route()
        expected = CHROME_WEBSOCKET_JA4
    else:
        expected = browser_tls.ja4_of(webtunnel.default_client_context())
    env = dict(os.environ, SSL_CERT_FILE=ca.ca_file,
               OBFSPROXY_HELLO="auto" if route == "browser" else "python")
    options = "url=https://wt.test%s;tls-cert=%s;tls-key=%s" % (PATH, ca.cert_file, ca.key_file)
    with EchoServer() as dest, \
            Program("server", "--transport=webtunnel", "--transport-options=" + options,
                    "--dest=127.0.0.1:%d" % dest.address[1], "127.0.0.1:0") as server, \
            HelloRecorder(server.address) as recorder, \
            Program("client", "--transport=webtunnel", "127.0.0.1:0", env=env) as client:
        args = "url=https://127.0.0.1:%d%s;servername=wt.test" % (recorder.address[1], PATH)

        def tunnel(number):
            data = b"tunnel %d" % number
            with socks5_connect(client.address, ("wt.test", 443), args=args) as sock:
                assert echo_round_trip(sock, data) == data

        for number in range(6):
            tunnel(number)
        threads = [threading.Thread(target=tunnel, args=(number,)) for number in range(6, 12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert dest.accepted == 12      # (the echo may see a reset: no close_notify on this route)
    assert len(recorder.hellos) == 12
    assert [hello.extension(PRE_SHARED_KEY) for hello in recorder.hellos] == [None] * 12
    assert [tlswire.ja4(hello) for hello in recorder.hellos] == [expected] * 12


# --- utls= on the browser route --------------------------------------------------------------------

@pytest.mark.parametrize("utls, target, noted", [
    (None, "chrome136", None),
    ("hellochrome_auto", "chrome136", None),
    ("hellochrome_120", "chrome136", "other versions are not offered"),
    ("hellofirefox_auto", "firefox155", None),
    ("hellorandomizednoalpn", "chrome136", "is not offered here"),
    ("", "chrome136", "hellorandomizednoalpn is not offered here"),
    ("hellosafari_auto", "chrome136", "is not offered here"),
    ("none", None, "Python's OpenSSL"),
])
def test_utls_picks_the_hello_and_says_what_it_cannot_honour(utls, target, noted):
    require_browser_route()
    options = {"url": URL} if utls is None else {"url": URL, "utls": utls}
    config = WebTunnel.client_config(options)
    if target is None:
        assert isinstance(config.context, ssl.SSLContext)
    else:
        assert config.context.target == target
    if noted is None:
        assert config.notes == ()
    else:
        assert len(config.notes) == 1 and noted in config.notes[0]


# --- The TLS object, in memory against Python's TLS server -------------------------------------------

def pair(ca, monkeypatch, **options):
    monkeypatch.setenv("SSL_CERT_FILE", ca.ca_file)
    client = WebTunnel.client_config(dict({"url": URL}, **options))
    server, _ = WebTunnel.server_config({"url": URL, "tls-cert": ca.cert_file, "tls-key": ca.key_file})
    return WebTunnel(True, client), WebTunnel(False, server)


def pump(client, server, to_server=b"", to_client=b"", split=None):
    """Run a client and a server to quiescence, each sending its bytes once open;
    ``split`` cuts every flight into pieces. Returns what each side received."""
    wires = [bytearray(client.start()), bytearray(server.start())]
    got, sent = [bytearray(), bytearray()], [False, False]
    sides, payloads = (client, server), (to_server, to_client)
    for _ in range(10000):
        moved = False
        for i in (0, 1):
            side, peer = sides[i], 1 - i
            if side.is_open and not sent[i]:
                sent[i] = True
                if payloads[i]:
                    wires[i] += side.send(payloads[i])
            if wires[peer]:
                moved = True
                data, wires[peer] = bytes(wires[peer]), bytearray()
                for piece in (split(data) if split else [data]):
                    got[i] += side.receive(piece)
                    wires[i] += side.data_to_send()
        if not moved and all(sent):
            break
    return bytes(got[0]), bytes(got[1])


def odd_pieces(data):
    sizes = [1, 7, 5000, 16389, 100]
    pieces, at, n = [], 0, 0
    while at < len(data):
        pieces.append(data[at:at + sizes[n % len(sizes)]])
        at += sizes[n % len(sizes)]
        n += 1
    return pieces


@pytest.mark.parametrize("split", [None, odd_pieces], ids=["whole", "odd pieces"])
def test_megabytes_both_ways_in_memory(ca, monkeypatch, split):
    require_browser_route()
    client, server = pair(ca, monkeypatch)
    up, down = os.urandom(3 << 20), os.urandom(2 << 20)
    to_client, to_server = pump(client, server, up, down, split)
    assert to_server == up and to_client == down
    assert isinstance(client._tls, browser_tls.BrowserTLS)


def test_the_peers_close_notify_ends_its_direction_and_ours_stays_open(ca, monkeypatch):
    require_browser_route()
    client, server = pair(ca, monkeypatch)
    pump(client, server, b"hello", b"")
    assert client.end() == b""            # no close_notify from curl: the FIN says it
    assert client.receive(server.send(b"after our end") + server.end()) == b"after our end"
    assert client.peer_ended


def test_dropped_tunnels_release_their_handles_and_sockets(ca, monkeypatch):
    require_browser_route()
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("counting descriptors needs /proc")
    curl = browser_tls.context().curl
    gc.collect()
    with curl.lock:
        curl.collect()          # what earlier tests dropped
    before = len(os.listdir("/proc/self/fd"))
    tunnels = [pair(ca, monkeypatch) for _ in range(20)]
    for client, server in tunnels:
        pump(client, server, b"x", b"y")
    assert len(os.listdir("/proc/self/fd")) == before + 40      # a socketpair per client
    del tunnels, client, server
    gc.collect()
    with curl.lock:
        curl.collect()
    assert len(os.listdir("/proc/self/fd")) == before
    assert not curl.taken and not curl.lingering


def test_the_first_step_waits_until_curl_has_written_its_hello(monkeypatch):
    """Nothing but curl's own timer can bring the hello out: a first step that gave up
    before it (HANDSHAKE_WAITS, made 1 here as a loaded machine's short wait) left a
    tunnel silent until its handshake timed out."""
    require_browser_route()
    monkeypatch.setattr(browser_tls, "HANDSHAKE_WAITS", 1)
    for _ in range(5):
        hello = tlswire.hello(browser_tls.first_flight(browser_tls.context(), "wt.test"))
        assert hello is not None and tlswire.ja4(hello) == CHROME_WEBSOCKET_JA4


def test_a_result_left_for_a_freed_handle_goes_with_it():
    """A handshake's end read for a handle (by another tunnel's timer step) that its
    owner never took must not outlive the handle: the next handle at that address would
    take it for its own."""
    require_browser_route()
    tls = browser_tls.context().wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="wt.test")
    curl = tls._curl
    key = int(curl.ffi.cast("uintptr_t", tls._easy))
    with curl.lock:
        curl.results[key] = browser_tls.CURLE_OK
    tls.close()
    assert key not in curl.results


# --- Both routes through nginx, TLS 1.2 and 1.3 ---------------------------------------------------------

@pytest.fixture(params=["1.2", "1.3"])
def front(request, tmp_path, ca, monkeypatch):
    """nginx with ssl_protocols TLSv1.2 or TLSv1.3 alone, its version checked."""
    require_nginx()
    version = request.param
    monkeypatch.setattr(nginx_module, "SERVER_BLOCK", nginx_module.SERVER_BLOCK.replace(
        "ssl_protocols TLSv1.2 TLSv1.3;", "ssl_protocols TLSv%s;" % version))
    with EchoServer() as dest, Program("server", "--transport=webtunnel",
                                       "--transport-options=url=" + URL,
                                       "--dest=127.0.0.1:%d" % dest.address[1], "127.0.0.1:0") as server:
        web = Nginx(tmp_path / "nginx", server.address, ca.cert_file, ca.key_file, path=PATH)
        try:
            check = ssl.create_default_context(cafile=ca.ca_file)
            with check.wrap_socket(socket.create_connection(web.address, timeout=10),
                                   server_hostname=testca.NAME) as probe:
                assert probe.version() == "TLSv" + version
            yield web
        finally:
            web.stop()


@pytest.mark.parametrize("route", ["browser", "python"])
def test_both_routes_carry_data_through_nginx(front, ca, route):
    if route == "browser":
        require_browser_route()
    env = dict(os.environ, SSL_CERT_FILE=ca.ca_file,
               OBFSPROXY_HELLO="auto" if route == "browser" else "python")
    with Program("client", "--transport=webtunnel", "127.0.0.1:0", env=env) as client:
        [line] = [line for line in client.log.lines if "webtunnel client hello" in line]
        assert "[NOTICE] crypto routes: " in line
        assert ("Chrome's WebSocket hello" in line) == (route == "browser")
        data = os.urandom(1 << 20)
        args = "url=%s;servername=%s" % (front.url, testca.NAME)
        with socks5_connect(client.address, ("wt.test", 443), args=args) as sock:
            assert echo_round_trip(sock, data) == data


# --- Falling back to Python's ssl ----------------------------------------------------------------

BROKEN = {
    "missing": ("raise ModuleNotFoundError('No module named curl_cffi', name='curl_cffi')\n", None,
                "curl_cffi is not installed"),
    # Installed, but without its binary module: not "not installed".
    "incomplete": ("__version__ = '0.0'\n", None,
                   "curl_cffi is installed but could not load (ImportError: curl_cffi._wrapper "
                   "is missing): reinstall it"),
    # Imports, but its binary is not libcurl: the self-test fails.
    "broken": ("__version__ = '0.0'\n", "", "curl_cffi's self-test failed"),
}


@pytest.mark.parametrize("how", list(BROKEN))
def test_without_a_working_curl_cffi_the_client_runs_on_python_ssl_and_says_so_once(
        how, tmp_path, ca):
    require_nginx()
    pytest.importorskip("cffi", reason="the fake curl_cffi stands beside a real cffi (pip's "
                        "requirements-dev has it; Debian's python3 without python3-cffi does not)")
    init, wrapper, words = BROKEN[how]
    package = tmp_path / "fake" / "curl_cffi"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    if wrapper is not None:
        (package / "_wrapper.py").write_text(wrapper)
    env = dict(os.environ, SSL_CERT_FILE=ca.ca_file, PYTHONPATH=str(tmp_path / "fake"))
    env.pop(browser_tls.HELLO_ENV, None)
    with EchoServer() as dest, Program("server", "--transport=webtunnel",
                                       "--transport-options=url=" + URL,
                                       "--dest=127.0.0.1:%d" % dest.address[1], "127.0.0.1:0") as server:
        web = Nginx(tmp_path / "nginx", server.address, ca.cert_file, ca.key_file, path=PATH)
        try:
            with Program("client", "--transport=webtunnel", "127.0.0.1:0", env=env) as client:
                args = "url=%s;servername=%s" % (web.url, testca.NAME)
                for _ in range(3):
                    with socks5_connect(client.address, ("wt.test", 443), args=args) as sock:
                        assert echo_round_trip(sock, b"on python ssl") == b"on python ssl"
                lines = [line for line in client.log.lines if "client hello" in line]
        finally:
            web.stop()
    assert len(lines) == 1, lines
    assert "[NOTICE]" in lines[0] and "Python's OpenSSL hello" in lines[0] and words in lines[0]


def test_a_changed_hello_fails_the_self_test(monkeypatch):
    require_browser_route()
    monkeypatch.setitem(browser_tls.TARGETS, "chrome", ("chrome136", "Chrome's WebSocket hello",
                                                       "t13d0000h1_000000000000_000000000000"))
    monkeypatch.setattr(browser_tls, "_route", None)
    monkeypatch.setattr(browser_tls, "_curl_binding", None)
    available, why = browser_tls.route()
    assert not available
    assert "JA4 %s, not the pinned t13d0000h1" % CHROME_WEBSOCKET_JA4 in why
    config = WebTunnel.client_config({"url": URL})
    assert isinstance(config.context, ssl.SSLContext)
    assert "curl_cffi's self-test failed" in webtunnel.hello_route()


def test_obfsproxy_hello_python_forces_pythons_ssl(monkeypatch):
    monkeypatch.setattr(browser_tls, "_route", None)
    monkeypatch.setattr(browser_tls, "_curl_binding", None)
    monkeypatch.setenv(browser_tls.HELLO_ENV, "python")
    assert browser_tls.route() == (False, "OBFSPROXY_HELLO=python")
    assert isinstance(WebTunnel.client_config({"url": URL}).context, ssl.SSLContext)
    monkeypatch.setattr(browser_tls, "_route", None)
    monkeypatch.setenv(browser_tls.HELLO_ENV, "pyhton")
    assert browser_tls.route()[0] is False and "is not 'auto' or 'python'" in browser_tls.route()[1]
