r"""browser_tls.py: the webtunnel client's TLS with a browser's ClientHello, through curl.

Why
---
What a censor sees first of a webtunnel connection is the TLS ClientHello, and
Python's ``ssl`` sends OpenSSL's, which no browser sends (JA4
``t13d1812h1_85036bcba153_d41ae481755e``). The optional package **curl_cffi**
ships curl-impersonate: libcurl with BoringSSL, set up to send the hellos of
real browsers. With the pinned target ``chrome136`` and ALPN ``http/1.1`` only,
curl's hello has JA4 ``t13d1515h1_8daaf6152771_0a20fe35d3a5``, what Chrome sends
when it opens a ``wss://`` WebSocket (a third-party capture of Chrome 149 gives
the same value). That is the hello a webtunnel upgrade should have.

How: curl does the TLS, the bytes still pass through the sans-IO seam
---------------------------------------------------------------------
curl only ever talks to one end of a ``socket.socketpair()``; we hold the other
end, and move the TLS records between it and the transport's ``receive()`` /
``send()`` / ``data_to_send()``, so the relay sees bytes, as with every other
transport, and its backpressure and fairness rules hold unchanged::

    peer's records --receive()--> [ours] ==socketpair==> [curl's end] --curl, BoringSSL-->
                                                                      plaintext (curl_easy_recv)
    plaintext --curl_easy_send--> BoringSSL --> [curl's end] ==> [ours] --send()--> records

curl is told (libcurl's public options):

* ``CURLOPT_CONNECT_ONLY=1`` on ``https://SERVERNAME:443/``: curl does the
  connection and the TLS handshake, then nothing; ``curl_easy_send`` and
  ``curl_easy_recv`` carry the stream (webtunnel's own code writes the upgrade
  request and reads the 101, as on the ``ssl`` route).
* ``CURLOPT_OPENSOCKETFUNCTION`` hands it our socketpair end,
  ``CURLOPT_SOCKOPTFUNCTION`` says it is already connected, and
  ``CURLOPT_CLOSESOCKETFUNCTION`` keeps curl from closing it (we do);
  ``CURLOPT_RESOLVE`` names an address for SERVERNAME, so curl never asks DNS.
  The dial stays the core's (``outbound.py``: bind address, ``--proxy``,
  ``TOR_PT_PROXY``).
* ``curl_easy_impersonate(target)`` picks the browser; ``CURLOPT_HTTP_VERSION``
  = 1.1 makes the ALPN ``http/1.1`` alone (offering ``h2`` gets h2 chosen by
  nginx, and the upgrade then hangs).
* Roots: ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when set, else the ones Python's
  ``ssl`` uses (``ssl.get_default_verify_paths()``), else curl_cffi's certifi.

The handshake runs without blocking through one ``curl_multi`` handle that every
tunnel of the process shares (``curl_multi_socket_action`` on the tunnel's own
socket, so a step costs the same with a thousand handshakes in flight; curl
takes its first step on a timer of its own, for which ``do_handshake`` lets a
millisecond pass, once or twice): it keeps the parsed CA store once
(``CURLOPT_CA_CACHE_TIMEOUT``, curl's default 24 h), which is what makes an idle
tunnel cost tens of KiB rather than the ~830 KiB of a handle that parses the
whole root bundle for itself. A multi handle and its easy handles are one
thread's objects at a time: ``_Curl.lock`` is held around every curl call (they
are short: every socket curl sees is a non-blocking socketpair). A handle stays
in the multi until the tunnel ends (``curl_easy_send`` fails once it is taken
out).

``curl_easy_send`` and ``curl_easy_recv`` are libcurl's public C API and
exported by curl_cffi's binary, but curl_cffi does not wrap them, so this module
opens that binary itself (``cffi``, ABI mode, no compiler) and calls the libcurl
functions it needs by their C declarations (``_DECLARATIONS``). That depends on
the binary's file name and its exported symbols, which a curl_cffi release may
change: hence the self-test.

The self-test (``route()``, once per process)
---------------------------------------------
The browser route is used only if all of these hold: ``OBFSPROXY_HELLO`` is
unset or ``auto`` (``python`` forces Python's ``ssl``); curl_cffi and cffi import
(curl_cffi needs CPython >= 3.10); its binary opens and has every symbol we
declare; a handle set up exactly as a tunnel's writes a ClientHello into the
socketpair; and ``tlswire.ja4`` of that hello is the pinned value in ``TARGETS``.
A curl_cffi upgrade that changes the hello therefore turns the route off (and
fails the tests) instead of sending an unknown fingerprint. Otherwise the
client runs on Python's ``ssl``; ``route()`` says which and why, and the core
says it once at start-up (the route report, ``WebTunnel.crypto_routes``).

What this route does not do
---------------------------
* No close_notify: libcurl has no call that sends one and keeps reading, and
  taking a connect-only handle out of a multi closes its socket without one
  (measured). ``unwrap()`` is therefore a no-op: the FIN alone ends our
  direction, and the peer's stays readable (half-close holds where the peer
  takes a bare FIN as the end; nginx ends an upgraded connection at the first
  end of either direction anyway).
* No resumption, as on the ``ssl`` route: every handshake is a full one, with no
  ``pre_shared_key``, so the hello is the pinned one every time and no ticket
  links one tunnel to the next. ``CURLOPT_SSL_SESSIONID_CACHE`` = 0 on every
  handle: the shared multi handle would otherwise keep one session for the
  site, and curl offered its ticket again and again, where Chrome uses a TLS 1.3
  ticket once (or never, as here). Cost: measured in memory against Python's TLS
  server, 1.6-1.9 ms of CPU per tunnel (both ends) against 1.5-1.65 ms resumed.
* Tested on Linux only (CI); the Windows wheel's separate DLL and its SOCKET type
  are provided for (``_binary_path``, ``_SOCKET_TYPE``) but never run.
* ``utls=`` values other than Chrome's and Firefox's (randomized hellos, Safari,
  iOS, custom specs) are not offered; ``webtunnel.client_config`` says so.
"""

import ipaddress
import os
import re
import socket
import ssl
import sys
import threading
import time
import weakref

import tlswire

HELLO_ENV = "OBFSPROXY_HELLO"

# utls= family -> (curl-impersonate target, what the hello is, its JA4 with ALPN http/1.1 only).
# Pinned targets: the "chrome"/"firefox" aliases move with curl_cffi releases.
TARGETS = {
    "chrome": ("chrome136", "Chrome's WebSocket hello",
               "t13d1515h1_8daaf6152771_0a20fe35d3a5"),
    # Firefox 155's hello with ALPN http/1.1 only; that real Firefox opens wss:// with this
    # ALPN (rather than h2, RFC 8441) is not verified.
    "firefox": ("firefox155", "Firefox's hello (ALPN http/1.1 only)",
                "t13d1517h1_8daaf6152771_3cbfd9057e0d"),
}
DEFAULT = "chrome"
# The User-Agent of the browser whose hello a family sends, for the upgrade request
# (webtunnel.browser_request): Chrome 136 on Windows, the version of the pinned hello.
# Firefox's WebSocket request says "Connection: keep-alive, Upgrade", which the upstream
# Go server refuses, so that family keeps lyrebird's request (no User-Agent here).
USER_AGENTS = {
    "chrome": ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 "
               "(KHTML, like Gecko) Chrome/136.0.0.0 Safari/537.36"),
}

# libcurl's numbers (curl/curl.h), under libcurl's names.
CURLOPT_URL, CURLOPT_ERRORBUFFER, CURLOPT_RESOLVE = 10002, 10010, 10203
CURLOPT_CAINFO, CURLOPT_CAPATH = 10065, 10097
CURLOPT_CONNECT_ONLY, CURLOPT_HTTP_VERSION, CURLOPT_NOSIGNAL = 141, 84, 99
CURLOPT_OPENSOCKETFUNCTION, CURLOPT_OPENSOCKETDATA = 20163, 10164
CURLOPT_SOCKOPTFUNCTION, CURLOPT_CLOSESOCKETFUNCTION = 20148, 20208
CURLOPT_SSL_SESSIONID_CACHE = 150
CURL_HTTP_VERSION_1_1 = 2
CURL_SOCKOPT_ALREADY_CONNECTED = 2
CURLMSG_DONE = 1
CURLMOPT_SOCKETFUNCTION = 20001
CURL_CSELECT_IN, CURL_CSELECT_OUT = 1, 2          # CURL_SOCKET_TIMEOUT: CURL_SOCKET_BAD
CURLE_OK, CURLE_AGAIN = 0, 81
CURLE_PEER_FAILED_VERIFICATION = 60
CURL_ERROR_SIZE = 256

# curl_socket_t is an int, but Windows' SOCKET (an unsigned pointer-sized integer) there.
_SOCKET_TYPE = "typedef %s curl_socket_t;\n" % ("uintptr_t" if os.name == "nt" else "int")
_DECLARATIONS = """
typedef struct { int msg; void *easy_handle; union { void *whatever; int result; } data; } CURLMsg;
char *curl_version(void);
void *curl_easy_init(void);
int curl_easy_setopt(void *, int, ...);
int curl_easy_impersonate(void *, const char *, int);
void curl_easy_cleanup(void *);
int curl_easy_send(void *, const void *, size_t, size_t *);
int curl_easy_recv(void *, void *, size_t, size_t *);
const char *curl_easy_strerror(int);
void *curl_multi_init(void);
int curl_multi_add_handle(void *, void *);
int curl_multi_remove_handle(void *, void *);
int curl_multi_perform(void *, int *);
int curl_multi_socket_action(void *, curl_socket_t, int, int *);
int curl_multi_setopt(void *, int, ...);
CURLMsg *curl_multi_info_read(void *, int *);
void *curl_slist_append(void *, const char *);
void curl_slist_free_all(void *);
"""

READ_SIZE = 64 * 1024          # plaintext per curl_easy_recv
PUMP_SIZE = 256 * 1024         # records moved per socketpair read
HANDSHAKE_WAITS = 50           # 1 ms pauses at most per handshake step (curl's timer)
HELLO_WAITS = 2000             # ... and before curl's hello is out: nothing else will wake it


class _Curl:
    """curl_cffi's binary, opened once: the libcurl functions, the shared multi
    handle, the three socket callbacks, and the lock around all of it."""

    def __init__(self):
        import cffi
        import curl_cffi
        from curl_cffi import _wrapper
        self.version = "curl_cffi %s" % getattr(curl_cffi, "__version__", "?")
        self.ffi = ffi = cffi.FFI()
        ffi.cdef(_SOCKET_TYPE + _DECLARATIONS)
        self.lib = lib = ffi.dlopen(_binary_path(_wrapper))
        self.libcurl = ffi.string(lib.curl_version()).decode("ascii", "replace").split(" ")[0]
        self.lock = threading.Lock()
        self.multi = lib.curl_multi_init()
        if self.multi == ffi.NULL:
            raise OSError("curl_multi_init failed")
        self.results = {}       # easy handle (int) -> its CURLcode, once its handshake ended
        # curl keeps track of the sockets it acts on only with a socket callback set; we
        # need no news from it (we know each tunnel's socket), so it does nothing.
        self.timeout_socket = ffi.cast("curl_socket_t", -1)     # CURL_SOCKET_BAD
        self.socket_news = ffi.callback("int(void *, curl_socket_t, int, void *, void *)",
                                        lambda easy, fd, what, data, socket_data: 0)
        lib.curl_multi_setopt(self.multi, CURLMOPT_SOCKETFUNCTION, self.socket_news)
        self.buffer, self.count = ffi.new("char[]", READ_SIZE), ffi.new("size_t *")   # locked use
        self.running = ffi.new("int *")
        self.garbage = []       # (easy, keep-alive objects) of tunnels dropped while locked

        # The fd to use rides in OPENSOCKETDATA; curl neither connects nor closes it: we
        # close it once curl has let go of it (``_release``).
        self.taken = set()      # fds curl opened through us and still holds
        self.lingering = {}     # fd -> socket of a dropped tunnel that curl still holds
        self.open_socket = ffi.callback("curl_socket_t(void *, int, void *)", self._open_socket)
        self.socket_options = ffi.callback("int(void *, curl_socket_t, int)",
                                           lambda data, fd, purpose: CURL_SOCKOPT_ALREADY_CONNECTED)
        self.close_socket = ffi.callback("int(void *, curl_socket_t)", self._close_socket)

    def _open_socket(self, data, purpose, address):
        fd = int(self.ffi.cast("intptr_t", data))
        self.taken.add(fd)
        return fd

    def _close_socket(self, data, fd):
        self.taken.discard(fd)
        sock = self.lingering.pop(fd, None)
        if sock is not None:
            sock.close()
        return 0

    def collect(self):
        """Free the handles of tunnels dropped while the lock was held (lock held)."""
        while self.garbage:
            self.free(*self.garbage.pop())

    def free(self, easy, sockets, keep=None):
        """End one tunnel's handle (curl closes the socket without a close_notify: it
        sends none for a connect-only handle taken out of a multi), then its
        socketpair, or curl's end of it once curl lets go (lock held)."""
        self.lib.curl_multi_remove_handle(self.multi, easy)
        self.lib.curl_easy_cleanup(easy)
        # A result read for this handle that its owner never took: the next handle
        # malloc puts at this address must not find it.
        self.results.pop(int(self.ffi.cast("uintptr_t", easy)), None)
        ours, theirs = sockets
        ours.close()
        if theirs.fileno() in self.taken:
            self.lingering[theirs.fileno()] = theirs
        else:
            theirs.close()

    def step(self, fd):
        """One turn of the handshake on socket ``fd``, and of any handle whose curl timer
        is due; note whose ended (lock held). ``curl_multi_socket_action`` runs only
        those, where ``curl_multi_perform`` would run every handshake in flight (a
        thousand tunnels opening at once made that quadratic)."""
        lib, ffi = self.lib, self.ffi
        lib.curl_multi_socket_action(self.multi, fd, CURL_CSELECT_IN | CURL_CSELECT_OUT, self.running)
        lib.curl_multi_socket_action(self.multi, self.timeout_socket, 0, self.running)
        while True:
            message = lib.curl_multi_info_read(self.multi, self.running)
            if message == ffi.NULL:
                return
            if message.msg == CURLMSG_DONE:
                self.results[int(ffi.cast("uintptr_t", message.easy_handle))] = message.data.result


def _binary_path(wrapper):
    """The file holding libcurl: the extension itself (Linux, macOS), or the DLL in
    curl_cffi.libs beside it (Windows wheels)."""
    if os.name != "nt":
        return wrapper.__file__
    import glob
    package = os.path.dirname(wrapper.__file__)
    found = sorted(glob.glob(os.path.join(os.path.dirname(package), "curl_cffi.libs",
                                          "libcurl-impersonate*.dll")))
    if not found:
        raise OSError("curl_cffi.libs/libcurl-impersonate*.dll not found")
    return found[0]


def _is_address(name):
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def default_roots(environ=os.environ):
    """(CA file or None, CA directory or None) for curl: what Python's ssl would use."""
    cafile, capath = environ.get("SSL_CERT_FILE"), environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return cafile or None, capath or None
    paths = ssl.get_default_verify_paths()
    cafile = paths.cafile if paths.cafile and os.path.isfile(paths.cafile) else None
    capath = paths.capath if paths.capath and os.path.isdir(paths.capath) else None
    if cafile is None and capath is None:
        try:
            import certifi
            cafile = certifi.where()
        except ImportError:
            pass
    return cafile, capath


class BrowserTLS:
    """The client side of one TLS connection, run by curl with a browser's hello.

    It answers to the part of ``ssl.SSLObject`` (over two ``ssl.MemoryBIO``) that
    webtunnel.py uses, so the transport code is the same on both routes:
    ``incoming.write(records)``, ``outgoing.read() -> records``, ``do_handshake()``
    (``ssl.SSLWantReadError`` until done), ``read(n)`` (``SSLWantReadError`` when
    nothing is there, b"" at the peer's close_notify), ``write(plaintext)``,
    ``unwrap()`` (a no-op here: no close_notify, see above). Failures
    are ``ssl.SSLError`` (``ssl.SSLCertVerificationError`` for a certificate that
    does not verify, with ``verify_message``) whose ``reason`` is BoringSSL's or
    curl's words.
    """

    def __init__(self, context, incoming, outgoing, servername):
        self._curl = curl = context.curl
        ffi, lib = curl.ffi, curl.lib
        target, roots = context.target, context.roots
        self._incoming, self._outgoing = incoming, outgoing
        self._servername = servername
        self._pending = bytearray()      # the peer's records not yet in the socketpair
        self._done = False               # the handshake ended well
        self._hello_out = False          # curl has written its ClientHello
        self._closed = False             # close() ran: curl's connection is gone
        self._ours, theirs = socket.socketpair()
        self._ours.setblocking(False)
        theirs.setblocking(False)
        literal = _is_address(servername)
        host = ("[%s]" % servername if ":" in servername else servername).encode(
            "ascii" if literal else "idna")
        cafile, capath = roots
        # Every cdata curl keeps a pointer to lives as long as the handle.
        self._keep = [ffi.new("char[]", b"https://%s:443/" % host),
                      ffi.new("char[]", CURL_ERROR_SIZE)]
        self._error = self._keep[1]
        # A name gets an address (any: the socket is ours), so that curl asks no DNS.
        resolve = ffi.NULL if literal else lib.curl_slist_append(ffi.NULL, b"%s:443:127.0.0.1" % host)
        self._keep.append(resolve if literal else ffi.gc(resolve, lib.curl_slist_free_all))
        for path in (cafile, capath):
            self._keep.append(ffi.new("char[]", os.fsencode(path)) if path else ffi.NULL)
        with self._curl.lock:
            self._curl.collect()
            self._easy = easy = lib.curl_easy_init()
            if easy == ffi.NULL:
                theirs.close()
                self._ours.close()
                raise ssl.SSLError("curl_easy_init failed")
            self._sockets = (self._ours, theirs)
            self._finalizer = weakref.finalize(self, _release, self._curl, easy, self._sockets,
                                               self._keep)
            long = lambda value: ffi.cast("long", value)   # noqa: E731
            lib.curl_easy_impersonate(easy, target.encode("ascii"), 0)
            options = [(CURLOPT_URL, self._keep[0]), (CURLOPT_ERRORBUFFER, self._error),
                       (CURLOPT_CONNECT_ONLY, long(1)),
                       (CURLOPT_HTTP_VERSION, long(CURL_HTTP_VERSION_1_1)),
                       (CURLOPT_NOSIGNAL, long(1)),
                       # No TLS session cache: the multi handle would share one across
                       # every tunnel, and curl offered the same ticket on each of them.
                       (CURLOPT_SSL_SESSIONID_CACHE, long(0)),
                       (CURLOPT_OPENSOCKETFUNCTION, self._curl.open_socket),
                       (CURLOPT_OPENSOCKETDATA, ffi.cast("void *", theirs.fileno())),
                       (CURLOPT_SOCKOPTFUNCTION, self._curl.socket_options),
                       (CURLOPT_CLOSESOCKETFUNCTION, self._curl.close_socket)]
            if not literal:
                options.append((CURLOPT_RESOLVE, resolve))
            if cafile:
                options.append((CURLOPT_CAINFO, self._keep[3]))
            if capath:
                options.append((CURLOPT_CAPATH, self._keep[4]))
            for option, value in options:
                code = lib.curl_easy_setopt(easy, option, value)
                if code != CURLE_OK:
                    raise ssl.SSLError("curl_easy_setopt(%d): %s" % (option, self._words(code)))
            code = lib.curl_multi_add_handle(self._curl.multi, easy)
            if code != CURLE_OK:
                raise ssl.SSLError("curl_multi_add_handle failed (%d)" % code)

    # The two BIOs -----------------------------------------------------------------------

    def _drain(self):
        """Move what curl wrote into the socketpair to the outgoing BIO."""
        while True:
            try:
                data = self._ours.recv(PUMP_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:       # closed by close()
                return
            if not data:
                return
            self._outgoing.write(data)
            self._hello_out = True

    def _push(self):
        """Move as much of the peer's records into the socketpair as it takes."""
        self._pending += self._incoming.read()
        while self._pending:
            try:
                sent = self._ours.send(self._pending)
            except (BlockingIOError, InterruptedError):
                return
            del self._pending[:sent]

    # The handshake ------------------------------------------------------------------------

    def do_handshake(self):
        """One step of the handshake: returns once it is done, ``ssl.SSLWantReadError``
        while it needs the peer's bytes. curl takes its connect step on a timer of its
        own, at millisecond grain: until curl has done something with what it has (its
        hello out, every byte of the peer's read, or the end), this lets a millisecond
        pass with the lock free and tries again, at most ``HANDSHAKE_WAITS`` times (the
        first step needs one or two; the later ones, driven by bytes, none), or
        ``HELLO_WAITS`` while the hello is not out."""
        if self._done:
            return
        curl = self._curl
        key = int(curl.ffi.cast("uintptr_t", self._easy))
        records = self._outgoing.pending
        result = None
        waits = 0
        # Until the hello is out no peer byte can come to wake this handshake again, so
        # the first step waits for curl's timer longer (up to HELLO_WAITS): on a loaded
        # machine a tunnel once sat silent until its handshake timed out.
        while waits < (HANDSHAKE_WAITS if self._hello_out else HELLO_WAITS):
            waits += 1
            with curl.lock:
                curl.collect()
                self._push()
                curl.step(self._sockets[1].fileno())
                self._drain()
                if key in curl.results:
                    result = curl.results.pop(key)
                    break
                if self._outgoing.pending > records or self._waits():
                    break
            time.sleep(0.001)
        if result is None:
            raise ssl.SSLWantReadError("the handshake needs the peer's bytes")
        if result != CURLE_OK:
            raise self._error_for(result)
        self._done = True

    def _waits(self):
        """True when curl has read every byte of the peer's given so far (it waits for
        more of them now, not for its timer); False before its hello is out."""
        if self._pending or not self._hello_out:
            return False
        try:
            self._sockets[1].recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return True
        return False

    def _words(self, code):
        text = self._curl.ffi.string(self._error).decode("utf-8", "replace").strip()
        return text or self._curl.ffi.string(self._curl.lib.curl_easy_strerror(code)).decode()

    def _error_for(self, code):
        """An ssl.SSLError saying what curl said, in the words OpenSSL would use where
        they differ only in phrasing (so that the user's advice is the same)."""
        words = self._words(code)
        if code == CURLE_PEER_FAILED_VERIFICATION:
            words = words.replace("SSL certificate problem: ", "")
            # "SSL certificate OpenSSL verify result: unable to get local issuer certificate (20)"
            words = re.sub(r"^.*verify result: (.*?)(?: \(\d+\))?$", r"\1", words)
            code = None
            if "no alternative certificate subject name matches" in words:
                words = "Hostname mismatch, certificate is not valid for '%s'." % self._servername
                code = 62                         # X509_V_ERR_HOSTNAME_MISMATCH, as ssl says it
            error = ssl.CertificateError(words)   # 3.7+: ssl.SSLCertVerificationError
            error.verify_message, error.reason = words, "CERTIFICATE_VERIFY_FAILED"
            error.verify_code = code
            return error
        error = ssl.SSLError(words)
        # BoringSSL's "error:...:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER": the name
        reason = words.rpartition(":")[2].strip()
        error.reason = reason if reason.replace("_", "").isalnum() and reason.isupper() else words
        return error

    # The data phase -----------------------------------------------------------------------

    def read(self, size=READ_SIZE):
        """Up to ``size`` bytes of plaintext the records fed so far carry."""
        curl, ffi = self._curl, self._curl.ffi
        if self._closed:
            raise ssl.SSLZeroReturnError("the TLS connection was closed")
        size = min(size, READ_SIZE)
        with curl.lock:
            buffer, got = curl.buffer, curl.count
            curl.collect()
            while True:
                self._push()
                code = curl.lib.curl_easy_recv(self._easy, buffer, size, got)
                if code != CURLE_AGAIN or not self._pending:
                    break
            self._drain()        # a reply BoringSSL owes (key update), or an alert
            plaintext = ffi.buffer(buffer, got[0])[:] if code == CURLE_OK else b""
        if code == CURLE_AGAIN:
            raise ssl.SSLWantReadError("no plaintext yet")
        if code != CURLE_OK:
            raise self._error_for(code)
        return plaintext       # b"" at the peer's close_notify

    def write(self, data):
        """Encrypt all of ``data``; the records wait in ``outgoing``."""
        curl, ffi = self._curl, self._curl.ffi
        view = memoryview(data)
        with curl.lock:
            curl.collect()
            sent = curl.count
            while view:
                code = curl.lib.curl_easy_send(self._easy, ffi.from_buffer(view), len(view), sent)
                if code == CURLE_OK:
                    view = view[sent[0]:]
                elif code != CURLE_AGAIN:
                    raise self._error_for(code)
                before = self._outgoing.pending
                self._drain()
                if code == CURLE_AGAIN and self._outgoing.pending == before:
                    # Not a full socketpair: BoringSSL waits for the peer (a renegotiation,
                    # which nginx never asks for). Stop rather than spin.
                    raise ssl.SSLError("TLS: curl cannot send before the peer answers")
        return len(data)

    def unwrap(self):
        """Nothing: libcurl cannot send a close_notify and keep the connection (taking
        the handle out closes the socket without one, measured), so on this route the
        FIN alone ends our direction, and the peer's stays readable."""

    def close(self):
        """Release the handle and the socketpair now (else when garbage-collected)."""
        self._closed = True
        self._finalizer()


def _release(curl, easy, sockets, keep):
    """A dropped tunnel's handle and socketpair, now, or at the next curl call when the
    lock is held (a finalizer may run inside a locked region of this very thread)."""
    if curl.lock.acquire(blocking=False):
        try:
            curl.free(easy, sockets)
        finally:
            curl.lock.release()
    else:
        curl.garbage.append((easy, sockets, keep))


# --- Which route, once per process ----------------------------------------------------------

_route_lock = threading.Lock()
_route = None       # (_Curl or None, why not)
_curl_binding = None


def _loaded():
    route()
    if _curl_binding is None:
        raise RuntimeError("browser_tls: the curl route is not available")
    return _curl_binding


class BrowserContext:
    """What ``webtunnel.ClientConfig.context`` holds on this route: like an
    ``ssl.SSLContext`` for a client, ``wrap_bio(incoming, outgoing,
    server_hostname)`` gives the TLS object of one connection (a ``BrowserTLS``).
    curl verifies the chain and the name, as ``ssl.create_default_context()`` does."""

    verify_mode = ssl.CERT_REQUIRED
    check_hostname = True

    def __init__(self, family, roots=None, curl=None):
        self.family = family
        self.target, self.hello, self.ja4 = TARGETS[family]
        self.user_agent = USER_AGENTS.get(family)
        self.roots = default_roots() if roots is None else roots
        self.curl = curl or _loaded()

    def wrap_bio(self, incoming, outgoing, server_side=False, server_hostname=None):
        if server_side:
            raise ValueError("browser_tls is a client's TLS only")
        return BrowserTLS(self, incoming, outgoing, server_hostname)


_contexts = {}


def context(family=DEFAULT):
    """The ``BrowserContext`` of ``family`` for the CA setting of the environment, made
    once per setting (as ``webtunnel.default_client_context``)."""
    key = (family, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    made = _contexts.get(key)
    if made is None:
        made = _contexts[key] = BrowserContext(family)
    return made


def first_flight(context, servername):
    """The bytes a client ``context`` (ssl.SSLContext or BrowserContext) sends first for
    ``servername``: its ClientHello, made without a network."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=servername)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    finally:
        if hasattr(tls, "close"):
            tls.close()
    return outgoing.read()


def ja4_of(context, servername="www.example.com"):
    """The JA4 of the hello a client ``context`` sends (``tlswire.ja4``), or None when
    what it wrote is no ClientHello."""
    hello = tlswire.hello(first_flight(context, servername))
    return None if hello is None else tlswire.ja4(hello)


def self_test(curl, family=DEFAULT):
    """None when a handle set up as a tunnel's sends ``family``'s pinned hello, else why not."""
    browser = BrowserContext(family, roots=(None, None), curl=curl)
    got = ja4_of(browser)
    if got is None:
        return "%s wrote no ClientHello" % browser.target
    if got != browser.ja4:
        return "%s's hello has JA4 %s, not the pinned %s" % (browser.target, got, browser.ja4)
    return None


def route(environ=os.environ):
    """(True, words) when the browser route passed its self-test in this process, else
    (False, why not); decided once, on first use."""
    global _route, _curl_binding
    with _route_lock:
        if _route is None:
            _route = _decide(environ)
        return _route


def _decide(environ):
    global _curl_binding
    asked = environ.get(HELLO_ENV, "").strip().lower()
    if asked == "python":
        return False, "%s=python" % HELLO_ENV
    if asked not in ("", "auto"):
        return False, "%s=%s is not 'auto' or 'python'" % (HELLO_ENV, environ[HELLO_ENV])
    if sys.version_info < (3, 10):
        return False, "curl_cffi needs Python 3.10 or later"
    try:
        curl = _Curl()
    except ImportError as exc:
        name = (getattr(exc, "name", None) or "curl_cffi").split(".")[0]
        if isinstance(exc, ModuleNotFoundError) and exc.name in ("curl_cffi", "cffi"):
            return False, "%s is not installed (pip install curl_cffi)" % name
        # It is there, but a part of it (its binary, its _wrapper) would not load.
        return False, ("curl_cffi is installed but could not load (%s: %s): reinstall it "
                       "(pip install --force-reinstall curl_cffi)"
                       % (type(exc).__name__, _import_words(exc)))
    except Exception as exc:     # a broken or changed binary: its self-test failed
        return False, "curl_cffi's self-test failed (%s: %s)" % (type(exc).__name__, exc)
    try:
        why = self_test(curl)
    except Exception as exc:
        why = "%s: %s" % (type(exc).__name__, exc)
    if why is not None:
        return False, "curl_cffi's self-test failed (%s)" % why
    _curl_binding = curl
    return True, "%s, %s" % (curl.version, curl.libcurl)


def _import_words(exc):
    """What an ImportError says, without the file path it may quote (the user's home)."""
    text = str(exc)
    missing = re.search(r"cannot import name '([^']+)'", text)
    if missing:
        return "%s.%s is missing" % (getattr(exc, "name", None) or "curl_cffi", missing.group(1))
    if getattr(exc, "name", None):
        return "no module %s" % exc.name
    return text.split(" (", 1)[0][:100]


def reset_for_tests():
    """Forget the decision (tests that force one route, then the other)."""
    global _route, _curl_binding
    with _route_lock:
        _route, _curl_binding = None, None
