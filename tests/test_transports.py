"""transports.py: the contract, proven on every registered transport; the recorder.

Every test here runs once per entry of ``transports.TRANSPORTS`` (and once per
row of ``CASES`` for that transport): a new transport is tested by its
registry line alone, and by a row in the tables below only when it needs
server options or client options other than the announced ones.

The wire is in memory, and the ends are driven exactly as the core drives
them (proxy.transport_handshake, then proxy.relay)::

    each end:  wire <- start()
               while not is_open:  plaintext += receive(what arrived, in some split)
                                   wire <- data_to_send()
               then relay: wire <- send(chunk)  or send_in_place(chunk) or send_paced(chunk)
                           plaintext <- receive(chunk)  or receive_in_place(chunk)

An end that opens starts relaying at once (its "greeting" may reach the peer
while the peer is still handshaking: the plaintext glued to a handshake).
Nothing here knows a transport's wire format: the known answers are in each
transport's own test module; these tests prove the seam.
"""

import contextlib
import itertools
import os
import stat
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transports

# --- What each transport needs ----------------------------------------------------


class Case:
    """One way to run a transport: the server's options, and the client's
    options given the server's announce dict (what Tor copies from SMETHOD ARGS
    into the bridge line, and from there into the client's SOCKS arguments).
    ``paced``: both ends send on their own schedule; ``server_paced``: the server does
    (default: as ``paced``; webtunnel's plain server paces its first pieces for a front)."""

    def __init__(self, label, server_options, client_options=dict, paced=False, server_paced=None):
        self.label, self.server_options = label, server_options
        self.client_options, self.paced = client_options, paced
        self.server_paced = paced if server_paced is None else server_paced


def bridge_line_args(announce):
    """pt-spec: the client gets exactly the announced ARGS."""
    return dict(announce)


CASES = {
    "obfs4": [Case("iat0", {}, bridge_line_args),
              Case("iat1", {"iat-mode": "1"}, bridge_line_args, paced=True),
              Case("iat2", {"iat-mode": "2"}, bridge_line_args, paced=True)],
    "obfs3": [Case("plain", {}, lambda announce: {})],
    "obfs2": [Case("plain", {}, lambda announce: {}),
              Case("secret", {"shared-secret": "correct horse", "ss-hash-iterations": "7"},
                   bridge_line_args)],
    "dummy": [Case("plain", {}, lambda announce: {})],
}
DEFAULT_CASES = [Case("default", {}, bridge_line_args)]   # a transport with no row yet


def webtunnel_tls_options():
    """A server that terminates TLS itself with the test CA's wt.test certificate
    (tests/testca.py); its clients trust that CA through SSL_CERT_FILE."""
    import tempfile

    import testca
    made = testca.make_ca(tempfile.mkdtemp(prefix="webtunnel-ca-"))
    WEBTUNNEL_CA.append(made.ca_file)
    return {"url": "https://wt.test/k7Qm2Zx1c1b00b6", "tls-cert": made.cert_file,
            "tls-key": made.key_file}


WEBTUNNEL_CA = []       # the CA file of the TLS case, once made


CASES["webtunnel"] = [Case("plain", {"url": "http://wt.test/k7Qm2Zx1c1b00b6"}, bridge_line_args,
                           server_paced=True),
                      Case("tls", webtunnel_tls_options, bridge_line_args)]

NAMES = list(transports.TRANSPORTS)
# A transport that owns its connection (meek: a series of HTTP requests, driven by the
# pump through ``connection`` and ``serve``) has no stream data phase for the in-memory
# wire below; its own tests drive it (tests/test_meek.py, tests/test_meek_live.py).
STREAM_NAMES = [name for name in NAMES if not hasattr(transports.TRANSPORTS[name], "serve")]
CASE_PARAMS = [pytest.param((name, case), id="%s-%s" % (name, case.label))
               for name in STREAM_NAMES for case in CASES.get(name, DEFAULT_CASES)]

# Options each must refuse with ValueError (and nothing else). obfs3 takes no
# options and ignores them all, as obfs4proxy does: nothing to refuse.
SOME_CERT = "A" * 70          # decodes to 52 bytes: a well-formed cert
BAD_CLIENT_OPTIONS = {
    "obfs4": [{}, {"iat-mode": "0"}, {"cert": SOME_CERT}, {"cert": "AAAA", "iat-mode": "0"},
              {"cert": SOME_CERT, "iat-mode": "3"}, {"cert": SOME_CERT, "iat-mode": "fast"},
              {"cert": "\u00e9" * 70, "iat-mode": "0"}, {"cert": SOME_CERT + "!", "iat-mode": "0"},
              {"node-id": "00" * 20, "public-key": "zz" * 32, "iat-mode": "0"}],
    "obfs2": [{"ss-hash-iterations": "0"}, {"ss-hash-iterations": "lots"},
              {"ss-hash-iterations": str(10 ** 8)}, {"secret": "x"}],
    "dummy": [{"cert": SOME_CERT}],
    "webtunnel": [{}, {"url": "ftp://wt.test/x"}, {"url": "https://wt.test/x", "cert": "AAAA"},
                  {"url": "https://wt.test/x", "sni-imitation": "a.example"},
                  {"url": "https://wt.test/x", "addr": "wt.test"}, {"url": "https://wt.test/x", "x": "1"}],
}
BAD_SERVER_OPTIONS = {
    "obfs4": [{"iat-mode": "3"}, {"iat-mode": "x"}, {"node-id": "00" * 20},
              {"node-id": "00" * 20, "private-key": "11" * 32, "drbg-seed": "zz" * 24}],
    "obfs2": BAD_CLIENT_OPTIONS["obfs2"],
    "dummy": [{"iat-mode": "0"}],
    "webtunnel": [{}, {"url": "https://wt.test/x", "tls-cert": "/nonexistent"}, {"iat-mode": "0"}],
}
# Transports whose fast path declines the first chunk (obfs3: our magic has not
# gone out, the peer's has not been found), so the False path is surely exercised.
DECLINES_AT_FIRST = {"obfs3"}
OPTION_NAMES = ["cert", "iat-mode", "node-id", "public-key", "private-key", "drbg-seed",
                "shared-secret", "ss-hash-iterations"]
SLOW = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Setup:
    """A transport's configs, as one listener and its clients would hold them."""

    def __init__(self, name, case, state_dir):
        self.name, self.case = name, case
        self.cls = transports.TRANSPORTS[name]
        server_options = case.server_options() if callable(case.server_options) else case.server_options
        self.server_config, self.announce = self.cls.server_config(dict(server_options), state_dir)
        self.ca = WEBTUNNEL_CA[-1] if name == "webtunnel" and WEBTUNNEL_CA else None
        with self.trust():
            self.client_config = self.cls.client_config(case.client_options(self.announce))

    def trust(self):
        return temporary_environment({"SSL_CERT_FILE": self.ca} if self.ca else {})

    def pair(self, wrap=lambda transport: transport):
        return wrap(self.cls(True, self.client_config)), wrap(self.cls(False, self.server_config))


@contextlib.contextmanager
def temporary_environment(variables):
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module", params=CASE_PARAMS)
def setup(request, tmp_path_factory):
    name, case = request.param
    return Setup(name, case, tmp_path_factory.mktemp("state-%s-%s" % (name, case.label)))


# --- The in-memory wire, driven as the core drives it ------------------------------

def whole(available):
    return available


def byte_by_byte(available):
    return 1


def cycling(sizes):
    """Chunks of the given sizes, over and over (the rest of what is there if less)."""
    sizes = itertools.cycle(sizes)
    return lambda available: min(available, next(sizes))


def state_of(transport):
    """A shallow picture of a transport's attributes, to prove a call changed
    none of them: buffers by content, everything else by identity or value.
    (A changed keystream position shows up later instead: the data goes wrong.)"""
    inner = transport
    while type(inner) in (transports.Recorder, Spy):
        inner = inner.inner
    return {key: bytes(value) if isinstance(value, (bytearray, memoryview)) else value
            for key, value in vars(inner).items()}


def assert_unchanged(transport, before, what):
    after = state_of(transport)
    assert after.keys() == before.keys(), "%s returned False but added/removed attributes" % what
    for key, old in before.items():
        new = after[key]
        assert new is old or new == old, "%s returned False but changed %s" % (what, key)


class Link:
    """Two ends of one connection and the bytes in flight to each."""

    def __init__(self, client, server, greetings=(b"", b"")):
        self.ends = (client, server)
        self.inbox = (bytearray(), bytearray())   # bytes on their way to ends[i]
        self.wire = ([], [])                      # everything ends[i] put on the wire
        self.plaintext = ([], [])                 # everything ends[i] got out of the peer's bytes
        self.greetings = list(greetings)          # sent by ends[i] as soon as it is open
        self.declined = 0                         # in-place calls that returned False

    def put(self, i, data):
        assert isinstance(data, bytes), "the wire takes bytes, got %r" % type(data)
        self.wire[i].append(data)
        self.inbox[1 - i].extend(data)

    def take(self, i, split):
        size = split(len(self.inbox[i]))
        data = bytes(self.inbox[i][:size])
        del self.inbox[i][:size]
        return data

    def greet_when_open(self, i):
        if self.greetings[i] and self.ends[i].is_open:
            self.send(i, self.greetings[i], "send")
            self.greetings[i] = b""

    def handshake(self, split):
        """proxy.transport_handshake for both ends, interleaved."""
        for i in (0, 1):
            self.put(i, self.ends[i].start())
        for i in (0, 1):
            self.greet_when_open(i)
        while not (self.ends[0].is_open and self.ends[1].is_open):
            moved = False
            for i in (0, 1):
                end = self.ends[i]
                if end.is_open or not self.inbox[i]:
                    continue
                out = end.receive(self.take(i, split))
                assert isinstance(out, bytes)
                self.plaintext[i].append(out)
                self.put(i, end.data_to_send())
                self.greet_when_open(i)
                moved = True
            assert moved, "deadlock: both ends wait, neither is open"

    def send(self, i, data, way):
        """What the relay's up direction does with one chunk read from the application."""
        end = self.ends[i]
        if way == "paced":
            pieces = end.send_paced(data)
            assert isinstance(pieces, list)
            for piece, delay in pieces:
                assert isinstance(piece, bytes) and piece and delay >= 0
                self.put(i, piece)
            return
        if way == "in_place":
            buffer = bytearray(data)
            view = memoryview(buffer)
            for _ in range(3):      # a False, repeated, must still have changed nothing
                before = state_of(end)
                done = end.send_in_place(view)
                assert done is True or done is False
                if done:
                    self.put(i, bytes(buffer))
                    return
                self.declined += 1
                assert buffer == data, "send_in_place returned False but changed the buffer"
                assert_unchanged(end, before, "send_in_place")
        self.put(i, end.send(data))

    def deliver(self, i, split, way):
        """What the relay's down direction does with what arrived for ends[i]."""
        end = self.ends[i]
        while self.inbox[i]:
            data = self.take(i, split)
            if way == "in_place":
                buffer = bytearray(data)
                before = state_of(end)
                done = end.receive_in_place(memoryview(buffer))
                assert done is True or done is False
                if done:
                    self.plaintext[i].append(bytes(buffer))
                    continue
                self.declined += 1
                assert buffer == data, "receive_in_place returned False but changed the buffer"
                assert_unchanged(end, before, "receive_in_place")
            out = end.receive(data)
            assert isinstance(out, bytes)
            self.plaintext[i].append(out)
        # The relay never asks for data_to_send(): an open end must owe nothing.
        assert end.data_to_send() == b"", "receive() after is_open left bytes owed"

    def received(self, i):
        return b"".join(self.plaintext[i])


def send_ways(end):
    ways = ["send"]
    if hasattr(end, "send_in_place"):
        ways.append("in_place")
    if getattr(end, "paced", False):
        ways.append("paced")
    return ways


def receive_ways(end):
    return ["receive", "in_place"] if hasattr(end, "receive_in_place") else ["receive"]


def talk(link, split, messages):
    """Greetings during the handshake, then each message both ways through every
    way each end offers; every byte must arrive, in order, once."""
    sent = [bytearray(link.greetings[0]), bytearray(link.greetings[1])]
    link.handshake(split)
    for i in (0, 1):
        assert link.ends[i].is_open
        assert link.ends[i].data_to_send() == b"", "owed bytes after the handshake, never sent"
    for message, (way0, way1), (in0, in1) in zip(
            messages, itertools.cycle(itertools.product(send_ways(link.ends[0]), send_ways(link.ends[1]))),
            itertools.cycle(itertools.product(receive_ways(link.ends[0]), receive_ways(link.ends[1])))):
        for i, way in ((0, way0), (1, way1)):
            link.send(i, message, way)
            sent[i] += message
        link.deliver(1, split, in1)
        link.deliver(0, split, in0)
    assert link.received(1) == bytes(sent[0]), "client -> server bytes differ"
    assert link.received(0) == bytes(sent[1]), "server -> client bytes differ"


MESSAGES = [b"GET / HTTP/1.0\r\n\r\n", bytes(range(256)) * 9, b"x", os.urandom(5000), b"\0" * 3000,
            b"the end"]


# --- The registry and the declared attributes ---------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_name_is_the_registry_key(name):
    cls = transports.TRANSPORTS[name]
    assert cls.name == name
    assert transports.transport_class(name) is cls


def test_an_unknown_transport_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError) as error:
        transports.transport_class("obfs5")
    assert all(name in str(error.value) for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_protocol_error_is_an_exception_the_core_catches(name):
    """The core catches ``Exception`` subclasses; a BaseException would pass by it."""
    error = transports.TRANSPORTS[name].ProtocolError
    assert isinstance(error, type) and issubclass(error, Exception)


def test_every_transport_has_a_case_row_or_takes_the_default():
    # A row for a transport that is not registered is a typo.
    assert set(CASES) <= set(NAMES)


def test_minimal_options_make_configs_and_a_string_announce(setup):
    assert isinstance(setup.announce, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in setup.announce.items())
    if setup.case.paced:
        assert setup.announce.get("iat-mode") == setup.case.server_options["iat-mode"]


def test_declared_attributes_have_their_types(setup):
    for end in setup.pair():
        assert isinstance(end.expensive, bool)
        assert isinstance(end.is_open, bool)
        assert isinstance(getattr(end, "paced", False), bool)
        linger = getattr(end, "failure_linger", None)
        assert linger is None or (isinstance(linger, (int, float)) and linger >= 0)
        assert end.name == setup.name and end.ProtocolError is setup.cls.ProtocolError
        if getattr(end, "paced", False):
            assert callable(end.send_paced)
    client, server = setup.pair()
    assert getattr(client, "paced", False) == setup.case.paced
    assert getattr(server, "paced", False) == setup.case.server_paced


# --- Options -------------------------------------------------------------------------

@pytest.mark.parametrize("name,options", [
    pytest.param(name, options, id="%s-%d" % (name, n))
    for name, rows in BAD_CLIENT_OPTIONS.items() for n, options in enumerate(rows)])
def test_bad_client_options_are_a_value_error(name, options):
    with pytest.raises(ValueError):
        transports.TRANSPORTS[name].client_config(dict(options))


@pytest.mark.parametrize("name,options", [
    pytest.param(name, options, id="%s-%d" % (name, n))
    for name, rows in BAD_SERVER_OPTIONS.items() for n, options in enumerate(rows)])
def test_bad_server_options_are_a_value_error(name, options, tmp_path):
    with pytest.raises(ValueError):
        transports.TRANSPORTS[name].server_config(dict(options), tmp_path)


def test_obfs4_without_a_state_directory_is_a_value_error():
    with pytest.raises(ValueError, match="state"):
        transports.TRANSPORTS["obfs4"].server_config({}, None)


option_names = st.sampled_from(OPTION_NAMES) | st.text(max_size=12)
option_values = st.sampled_from(["", "0", "1", "2", "3", "-1", "+1", "00" * 20, "11" * 32, "22" * 24,
                                 SOME_CERT]) | st.text(max_size=90)
any_options = st.dictionaries(option_names, option_values, max_size=4)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, **SLOW)
@given(options=any_options)
def test_any_client_options_make_a_working_config_or_a_value_error(name, options):
    cls = transports.TRANSPORTS[name]
    try:
        config = cls.client_config(dict(options))
    except ValueError:
        return
    assert isinstance(cls(True, config).start(), bytes)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, **SLOW)
@given(options=any_options)
def test_any_server_options_make_a_working_config_or_a_value_error(name, options):
    cls = transports.TRANSPORTS[name]
    with tempfile.TemporaryDirectory() as state_dir:
        try:
            config, announce = cls.server_config(dict(options), state_dir)
        except ValueError:
            return
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in announce.items())
        assert isinstance(cls(False, config).start(), bytes)


class Plain:
    """A transport's client_config as a new author writes it: a plain ValueError."""

    @classmethod
    def client_config(cls, options):
        if "key" not in options:
            raise ValueError("no key= given")
        return options


@pytest.mark.parametrize("cls, options, fixed, refused", [
    (Plain, {}, False, False),                      # a SOCKS client given nothing: nothing to check
    (Plain, {}, True, True),                        # fixed: the options are all it will have
    (Plain, {"colour": "1"}, False, True),          # given some: checked, no .missing
    (transports.TRANSPORTS["obfs4"], {"iat-mode": "0"}, False, False),  # .missing: cert
    (transports.TRANSPORTS["obfs4"], {"iat-mode": "0"}, True, True),
    (transports.TRANSPORTS["obfs4"], {"cert": "AAAA", "iat-mode": "0"}, False, True),
    (transports.TRANSPORTS["webtunnel"], {"servername": "a.example"}, False, False),  # .missing: url
])
def test_client_options_at_start_up_follow_the_contract(cls, options, fixed, refused):
    if refused:
        with pytest.raises(ValueError):
            transports.check_client_options(cls, options, fixed)
    else:
        transports.check_client_options(cls, options, fixed)


SECRET_MARK = "Q7secretQ7"


@pytest.mark.parametrize("name", [name for name in NAMES
                                  if getattr(transports.TRANSPORTS[name], "secret_options", ())])
@settings(max_examples=40, **SLOW)
@given(options=any_options, tails=st.lists(option_values, min_size=2, max_size=2))
def test_no_config_error_quotes_a_secret_options_value(name, options, tails):
    """The contract: a secret option's value never reaches a log, and config errors
    do (SMETHOD-ERROR, a refused SOCKS connection at NOTICE)."""
    cls = transports.TRANSPORTS[name]
    for key in cls.secret_options:
        options = dict(options, **{key: SECRET_MARK + tails[0] + SECRET_MARK + tails[1]})
    with tempfile.TemporaryDirectory() as state_dir:
        for make in (cls.client_config, lambda o: cls.server_config(o, state_dir)):
            try:
                make(dict(options))
            except ValueError as exc:
                assert SECRET_MARK not in str(exc)


def test_obfs3_takes_any_192_bytes_for_a_public_value():
    """Why proxy.handle_server cannot promise obfs3 probes never reach --dest (review-4
    finding 10): a server opens on 192 random bytes, as obfs4proxy's obfs3 does."""
    cls = transports.TRANSPORTS["obfs3"]
    config, _ = cls.server_config({}, None)
    server = cls(False, config)
    server.start()
    server.receive(os.urandom(192))
    assert server.is_open


# --- Handshake and data, as the core drives them --------------------------------------

@pytest.mark.parametrize("split", [whole, byte_by_byte], ids=["whole", "byte-by-byte"])
def test_handshake_and_data_both_ways(setup, split):
    client, server = setup.pair()
    link = Link(client, server)
    talk(link, split, MESSAGES if split is whole else MESSAGES[:3])
    assert client.is_open and server.is_open


# Bugs reported to the owners, each proven here until fixed (then drop the entry).
KNOWN_BUGS = {}   # (transport, case label) -> why it is expected to fail, until fixed


def test_the_announced_args_are_all_a_client_needs(setup, request):
    """pt-spec: Tor hands the client exactly the SMETHOD ARGS (via the bridge
    line), nothing else; with them the client must get through."""
    reason = KNOWN_BUGS.get((setup.name, setup.case.label))
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    with setup.trust():      # webtunnel with TLS: the test CA stands in for the system roots
        client = setup.cls(True, setup.cls.client_config(dict(setup.announce)))
    link = Link(client, setup.cls(False, setup.server_config))
    talk(link, whole, [b"ping"])


def test_data_glued_to_the_handshake_arrives(setup):
    """Each end relays as soon as it is open: its first bytes may reach a peer
    still in its handshake loop, which must return them from receive()."""
    client, server = setup.pair()
    link = Link(client, server, greetings=(b"client speaks first", b"server banner\r\n"))
    talk(link, whole, [b"then more"])


split_sizes = st.lists(st.integers(1, 3000), min_size=1, max_size=12)


@settings(max_examples=12, **SLOW)
@given(sizes=split_sizes, messages=st.lists(st.binary(min_size=1, max_size=4000), min_size=1, max_size=4),
       greet=st.booleans())
def test_every_split_gives_the_same_bytes(setup, sizes, messages, greet):
    client, server = setup.pair()
    link = Link(client, server, greetings=(b"hello", b"olleh") if greet else (b"", b""))
    talk(link, cycling(sizes), messages)


def test_in_place_false_leaves_the_connection_usable(setup):
    """Where a transport offers the fast path and declines a chunk (obfs3:
    before the magic), the core's fallback on the same chunk must still work."""
    client, server = setup.pair()
    if not hasattr(client, "send_in_place"):
        pytest.skip("%s has no in-place fast path" % setup.name)
    link = Link(client, server)
    link.handshake(whole)
    for i in (0, 1):
        link.send(i, b"first chunk, in place if it can", "in_place")
    for i in (1, 0):
        link.deliver(i, cycling([7, 300]), "in_place")
    assert link.received(0) == link.received(1) == b"first chunk, in place if it can"
    if setup.name in DECLINES_AT_FIRST:
        assert link.declined, "the declining path was not exercised"


# --- The peer is not speaking us -------------------------------------------------------

garbage = st.lists(st.binary(min_size=1, max_size=4096), min_size=1, max_size=4)


def feed_garbage(end, chunks):
    """receive() of junk: plaintext bytes (still waiting, or a data phase with no
    integrity), or the transport's ProtocolError. Nothing else, ever."""
    try:
        for chunk in chunks:
            assert isinstance(end.receive(chunk), bytes)
            assert isinstance(end.data_to_send(), bytes)
    except end.ProtocolError:
        pass


@settings(max_examples=25, **SLOW)
@given(chunks=garbage)
def test_garbage_in_the_handshake_is_a_protocol_error_or_a_wait(setup, chunks):
    client, server = setup.pair()
    for end in (client, server):
        end.start()
        feed_garbage(end, chunks)


@settings(max_examples=15, **SLOW)
@given(chunks=garbage)
def test_garbage_after_the_handshake_is_a_protocol_error_or_data(setup, chunks):
    client, server = setup.pair()
    link = Link(client, server)
    link.handshake(whole)
    for end in (client, server):
        feed_garbage(end, chunks)


def test_a_long_stream_of_junk_never_raises_anything_else(setup):
    junk = os.urandom(20000)
    for chunks in ([junk], [junk[i:i + 1000] for i in range(0, len(junk), 1000)]):
        client, server = setup.pair()
        for end in (client, server):
            end.start()
            feed_garbage(end, chunks)


# --- Recorder ----------------------------------------------------------------------

class Spy:
    """The wrapped transport, with a log of what each call returned."""

    def __init__(self, inner):
        self.inner, self.results = inner, []

    def __getattr__(self, attribute):
        value = getattr(self.inner, attribute)
        if not callable(value) or isinstance(value, type):
            return value

        def call(*args):
            result = value(*args)
            self.results.append((attribute, result))
            return result
        return call


def test_recorder_passes_everything_through_and_records_the_wire(setup):
    logs = {}

    def wrap(transport):
        spy = Spy(transport)
        sent, received = [], []
        recorder = transports.Recorder(spy, sent.append, received.append)
        logs[recorder] = (spy, sent, received)
        for attribute in ("name", "initiator", "ProtocolError", "expensive"):
            assert getattr(recorder, attribute) == getattr(transport, attribute)
        assert recorder.paced == getattr(transport, "paced", False)
        assert recorder.failure_linger == getattr(transport, "failure_linger", None)
        assert transports.innermost(recorder) is spy
        return recorder

    client, server = setup.pair(wrap)
    link = Link(client, server, greetings=(b"hi", b"ho"))

    # Every value the recorder returns is the one the transport returned.
    def checked(recorder, method):
        spy = logs[recorder][0]
        call = getattr(recorder, method)

        def check(*args):
            before = len(spy.results)
            result = call(*args)
            inner = [r for name, r in spy.results[before:] if name == method]
            assert inner, "%s did not reach the transport" % method
            assert result == inner[-1]
            return result
        return check

    for end in (client, server):
        for method in ("start", "receive", "data_to_send", "send", "send_paced",
                       "send_in_place", "receive_in_place"):
            if method in ("send_in_place", "receive_in_place") and \
                    not hasattr(transports.innermost(end), method):
                continue
            setattr(end, method, checked(end, method))
    talk(link, cycling([5, 700, 3000]), MESSAGES)
    for i, end in enumerate(link.ends):
        _, sent, received = logs[end]
        assert b"".join(sent) == b"".join(link.wire[i]), "the recording of what we sent"
        assert b"".join(received) == b"".join(link.wire[1 - i]), "the recording of what arrived"


def outcome(end, chunks):
    end.start()
    try:
        for chunk in chunks:
            end.receive(chunk)
    except end.ProtocolError as error:
        return type(error)
    return None


def test_recorder_passes_a_protocol_error_through(setup):
    junk = [os.urandom(9000) for _ in range(3)]
    for plain, wrapped in zip(setup.pair(), setup.pair()):
        recorder = transports.Recorder(wrapped, lambda data: None, lambda data: None)
        assert outcome(recorder, junk) == outcome(plain, junk)


def read_recordings(directory, role):
    """{suffix: bytes} of the one connection recorded by ``role`` (client/server)."""
    found = {}
    for path in directory.iterdir():
        if "-%s-" % role in path.name:
            suffix = next(s for s in transports.ROLE_SUFFIXES if path.name.endswith(s))
            assert suffix not in found, "two %s recordings" % role
            found[suffix] = path.read_bytes()
    return found


def test_record_dir_saves_each_sides_wire_bytes(setup, tmp_path):
    record = transports.RecordDir(tmp_path / "rec")
    client, server = setup.pair(record.wrap)
    link = Link(client, server)
    talk(link, whole, MESSAGES[:3])
    from_client, from_server = b"".join(link.wire[0]), b"".join(link.wire[1])
    initiator, responder = transports.ROLE_SUFFIXES
    for role in ("client", "server"):
        found = read_recordings(tmp_path / "rec", role)
        assert found == {initiator: from_client, responder: from_server}


def test_recordings_are_readable_by_their_owner_only(tmp_path):
    directory = tmp_path / "rec"
    transport = transports.RecordDir(directory).wrap(transports.Dummy(True))
    transport.send(b"secret traffic")
    if os.name != "posix":
        pytest.skip("POSIX permission bits")
    assert directory.stat().st_mode & 0o077 == 0
    files = list(directory.iterdir())
    assert files and all(path.stat().st_mode & 0o077 == 0 for path in files)
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)
