"""pool.py, and the proxy and transport hooks that use it (issue 12).

A pool hands out single-use handshake material (obfs4/obfs3 keypairs, obfs2 first
messages) made by a background thread while the proxy is idle. What must hold:
every item goes to one connection only; the stock never grows past its size; an
empty pool still answers (the item is made on the spot); nothing is made while
the owner says it is busy; a full pool's thread ends, so a proxy at rest runs
none; and a side built from pooled material speaks its protocol with a plain side.
"""

import threading
import time

import pytest

import obfs2
import obfs3
import obfs4
import pool
import proxy
import transports


def wait_until(check, timeout=10.0, what="condition"):
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            pytest.fail("%s: not within %.0f s" % (what, timeout))
        time.sleep(0.005)


class Counter:
    """make(): 1, 2, 3, ... and how many were made."""

    def __init__(self):
        self.made = 0
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            self.made += 1
            return self.made


def refill_threads():
    return [t for t in threading.enumerate() if t.name.endswith("-refill")]


# --- Pool ---------------------------------------------------------------------------

def test_every_item_is_handed_out_once_and_the_stock_is_bounded():
    make = Counter()
    stock = pool.Pool(make, size=4, name="t1")
    wait_until(lambda: len(stock) == 4, what="the pool full")
    time.sleep(0.05)
    assert make.made == 4                          # full: nothing more is made
    taken = [stock.take() for _ in range(10)]
    assert len(set(taken)) == 10                   # never the same item twice
    assert stock.hits + stock.misses == 10 and stock.hits >= 4
    stock.close()


def test_an_empty_pool_makes_the_item_on_the_spot():
    gate = threading.Event()
    make = Counter()
    stock = pool.Pool(make, size=3, idle=gate.is_set, name="t2")
    assert stock.take() == 1 and stock.misses == 1 and stock.hits == 0
    stock.close()


def test_nothing_is_made_ahead_while_the_owner_is_busy():
    gate = threading.Event()
    make = Counter()
    stock = pool.Pool(make, size=3, idle=gate.is_set, name="t3")
    time.sleep(0.2)
    assert make.made == 0 and len(stock) == 0
    gate.set()                                     # idle now
    wait_until(lambda: len(stock) == 3, what="the pool filled once idle")
    assert [stock.take() for _ in range(3)] == [1, 2, 3] and stock.hits == 3
    stock.close()


def test_close_drops_the_stock_and_stops_the_thread():
    stock = pool.Pool(Counter(), size=2, name="t4")
    wait_until(lambda: len(stock) == 2)
    stock.close()
    assert len(stock) == 0
    wait_until(lambda: not [t for t in refill_threads() if t.name == "t4-refill"], what="thread gone")
    assert stock.take() == 3                       # still answers, on the spot


def test_a_full_pool_lets_its_thread_end_and_a_take_starts_another(monkeypatch):
    monkeypatch.setattr(pool, "LINGER", 0.05)
    stock = pool.Pool(Counter(), size=2, name="t5")
    wait_until(lambda: len(stock) == 2)
    wait_until(lambda: not [t for t in refill_threads() if t.name == "t5-refill"], what="thread ended")
    stock.take()
    wait_until(lambda: len(stock) == 2, what="refilled by a new thread")
    stock.close()


def test_size_zero_is_no_pool():
    make = Counter()
    stock = pool.Pool(make, size=0, name="t6")
    time.sleep(0.05)
    assert make.made == 0 and not [t for t in refill_threads() if t.name == "t6-refill"]
    assert stock.take() == 1 and stock.misses == 1


@pytest.mark.parametrize("text, size", [("", pool.DEFAULT_SIZE), ("0", 0), ("3", 3), ("007", 7),
                                        ("4096", pool.MAX_SIZE)])
def test_size_from_the_environment(text, size):
    assert pool.configured_size({"OBFSPROXY_POOL_SIZE": text}) == size
    assert pool.configured_size({}) == pool.DEFAULT_SIZE


@pytest.mark.parametrize("text", ["x", "-1", "+3", " 3", "3 ", "\u00b2", "\u2082", "\u2460", "\u0661\u0660",
                                  "4097", "9" * 5000, "1e3"],
                         ids=["x", "-1", "+3", "leading space", "trailing space", "superscript 2",
                              "subscript 2", "circled 1", "Arabic-Indic 10", "over the bound",
                              "5000 digits", "1e3"])
def test_a_size_that_cannot_be_honoured_is_an_error_naming_the_variable(text):
    """"²" passed str.isdigit() and failed int() with "invalid literal for int()", naming
    nothing; 5000 digits failed int() too; Arabic-Indic digits were taken as 10."""
    with pytest.raises(ValueError) as error:
        pool.configured_size({"OBFSPROXY_POOL_SIZE": text})
    assert str(error.value).startswith("OBFSPROXY_POOL_SIZE must be a whole number in 0..4096, not ")
    assert len(str(error.value)) < 120


# --- The transports' hooks ----------------------------------------------------------

def talk(client, server):
    """Run the handshake in memory, then one message each way."""
    to_server, to_client = client.start(), server.start()
    for _ in range(4):
        got = server.receive(to_server) if to_server else b""
        to_client += server.data_to_send()
        got += client.receive(to_client) if to_client else b""
        to_server, to_client = client.data_to_send(), b""
        if client.is_open and server.is_open:
            break
    assert server.receive(client.send(b"up")) == b"up"
    assert client.receive(server.send(b"down")) == b"down"


def obfs4_configs():
    identity = obfs4.Identity(bytes(range(20)), bytes(range(32)), bytes(24))
    return (obfs4.ClientConfig(identity.node_id, identity.public_key, 0), obfs4.ServerConfig(identity))


def test_pooled_obfs4_sides_use_the_pooled_keypair_and_talk():
    client_config, server_config = obfs4_configs()
    key, make = transports.pool_recipe("obfs4", True, client_config)
    keypair = make()
    client = transports.pooled_transport("obfs4", True, client_config, lambda: keypair)
    assert client.start()[:32] == keypair[2]                 # X' on the wire is the pooled one
    server = transports.pooled_transport("obfs4", False, server_config, make)
    assert server_config.keypairs is None                    # the listener's config is untouched
    client = transports.pooled_transport("obfs4", True, obfs4_configs()[0], make)
    talk(client, server)


def test_pooled_obfs3_sides_use_the_pooled_keypair_and_talk():
    key, make = transports.pool_recipe("obfs3", False, obfs3.Obfs3Config())
    keypair = make()
    side = transports.pooled_transport("obfs3", True, obfs3.Obfs3Config(), lambda: keypair)
    assert side.start()[:192] == keypair[1]
    talk(transports.pooled_transport("obfs3", True, obfs3.Obfs3Config(), make), obfs3.Obfs3(False))


@pytest.mark.parametrize("secret", [None, b"s3cret"])
@pytest.mark.parametrize("pooled_side", ["client", "server"])
def test_a_pooled_obfs2_side_sends_the_prepared_message_and_talks(secret, pooled_side):
    config = obfs2.Config(secret, hash_iterations=10)
    initiator = pooled_side == "client"
    recipe = transports.pool_recipe("obfs2", initiator, config)
    if secret and not initiator:
        assert recipe is None            # a secret responder answers only checked clients
        return
    key, make = recipe
    seed, padlen, message = prepared = make()
    side = transports.pooled_transport("obfs2", initiator, config, lambda: prepared)
    assert side.seed == seed and side.padlen == padlen and side.handshake() == message
    other = obfs2.Obfs2(not initiator, config)
    if initiator:
        talk(side, other)
    else:
        talk(other, side)


def test_obfs2_pools_are_per_role_and_secret():
    keys = {transports.pool_recipe("obfs2", initiator, obfs2.Config(secret, 10))[0]
            for initiator in (True, False) for secret in (None, b"a")
            if transports.pool_recipe("obfs2", initiator, obfs2.Config(secret, 10))}
    assert len(keys) == 3
    assert transports.pool_recipe("dummy", True, None) is None


# --- The proxy ----------------------------------------------------------------------

def test_key_work_is_idle_only_after_a_quiet_spell(monkeypatch):
    monkeypatch.setattr(proxy, "QUIET_SECONDS", 0.05)
    work = proxy.KeyWork()
    assert work.idle()
    work.begin()
    assert not work.idle()                               # a handshake is under way
    work.end()
    assert not work.idle()                               # ... and just ended
    wait_until(work.idle, what="idle after the quiet spell")


def test_a_listener_gets_a_pool_and_its_connections_take_from_it():
    server = proxy.Proxy(pool_size=3)
    server.listen(("127.0.0.1", 0), proxy.handle_server,
                  proxy.Settings(transport="obfs3", config=obfs3.Obfs3Config(), dest=("127.0.0.1", 1)))
    settings = server.listeners[0][2]
    (stock,) = server.pools._pools.values()
    wait_until(lambda: len(stock) == 3, what="the listener's pool full")
    side = settings.new_transport(initiator=False)
    side.start()
    assert stock.hits == 1
    server.pools.close()
    server.listeners[0][0].close()


def test_pool_size_zero_makes_no_pools():
    server = proxy.Proxy(pool_size=0)
    server.listen(("127.0.0.1", 0), proxy.handle_socks_client, proxy.Settings(transport="obfs4"))
    assert server.pools._pools == {}
    assert server.listeners[0][2].pools.taker("obfs4", True, None) is None
    server.listeners[0][0].close()


# --- The Parking: quiet tunnels wait without a thread (proxy.py) ----------------------
#
# Closing thousands of idle tunnels at once used to wake thousands of threads together
# (a minute and ~100 CPU-s for 5,000, with SIGTERM unanswered meanwhile). Now a relay
# quiet for PARK_AFTER hands its sockets to one poller thread and frees its own.

def socks_echo(client_address, dest_address, payload=b"hello"):
    from support import recv_exact, socks5_connect
    sock = socks5_connect(client_address, dest_address)
    sock.sendall(payload)
    assert recv_exact(sock, len(payload)) == payload
    return sock


def conn_threads():
    return [t for t in threading.enumerate() if t.name.startswith("conn-")]


@pytest.fixture
def pair(monkeypatch):
    """An in-process dummy server and SOCKS client in front of an echo service, with
    a short PARK_AFTER: (client address, echo address, server Program, client Program)."""
    from support import EchoServer
    monkeypatch.setattr(proxy, "PARK_AFTER", 0.05)
    echo = EchoServer(backlog=512)
    server, client = proxy.Proxy(pool_size=0), proxy.Proxy(pool_size=0)
    server_address = server.listen(("127.0.0.1", 0), proxy.handle_server,
                                   proxy.Settings(transport="dummy", dest=echo.address))
    client_address = client.listen(("127.0.0.1", 0), proxy.handle_socks_client,
                                   proxy.Settings(transport="dummy"))
    for each in (server, client):
        threading.Thread(target=each.serve, daemon=True).start()
        each.ready.wait(10)
    if server.parking is None:
        pytest.skip("no epoll here: nothing parks")
    yield client_address, server_address, server, client
    for each in (server, client):
        each.stop()
    echo.close()


def test_a_quiet_tunnel_parks_and_still_carries_data_both_ways(pair):
    from support import recv_exact
    client_address, server_address, server, client = pair
    sock = socks_echo(client_address, server_address)
    wait_until(lambda: len(server.parking) == 1 and len(client.parking) == 1, what="both ends parked")
    sock.sendall(b"after parking")                       # one step on the poller, parked again
    assert recv_exact(sock, 13) == b"after parking"
    big = bytes(range(256)) * 4096                       # 1 MiB: a thread again, then parked
    writer = threading.Thread(target=sock.sendall, args=(big,), daemon=True)
    writer.start()
    assert recv_exact(sock, len(big)) == big
    writer.join(10)
    wait_until(lambda: len(server.parking) == 1 and len(client.parking) == 1, what="parked again")
    sock.close()
    wait_until(lambda: server.live == 0 and client.live == 0, what="the tunnel ended on both")
    assert len(server.parking) == 0 and len(client.parking) == 0


def test_closing_many_parked_tunnels_at_once_wakes_no_thread_per_tunnel(pair):
    client_address, server_address, server, client = pair
    socks = [socks_echo(client_address, server_address, b"x") for _ in range(150)]
    wait_until(lambda: len(server.parking) == 150 and len(client.parking) == 150, what="all parked")
    wait_until(lambda: len(conn_threads()) <= 2 * proxy.Proxy.SPARE_THREADS + 2, timeout=15,
               what="their threads gone")
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], len(conn_threads()))
            time.sleep(0.001)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for sock in socks:
        sock.close()
    wait_until(lambda: server.live == 0 and client.live == 0, timeout=30, what="every tunnel ended")
    done.set()
    watcher.join(5)
    assert peak[0] <= 2 * proxy.Proxy.SPARE_THREADS + 2, "%d connection threads woke" % peak[0]


def test_a_tunnel_that_cannot_park_carries_on_with_its_thread(pair, monkeypatch):
    from support import recv_exact
    monkeypatch.setattr(proxy.Parking, "park", lambda self, tunnel: False)
    client_address, server_address, server, client = pair
    sock = socks_echo(client_address, server_address)
    time.sleep(0.3)                                      # several PARK_AFTER quiet spells
    sock.sendall(b"still here")
    assert recv_exact(sock, 10) == b"still here"
    assert len(server.parking) == 0
    sock.close()
    wait_until(lambda: server.live == 0 and client.live == 0, what="the tunnel ended")


@pytest.mark.slow
def test_sigterm_is_answered_while_thousands_of_tunnels_close():
    """3,000 idle tunnels through a real client and server, all closed at once, then
    SIGTERM to both: they exit within seconds (they used to spend half a minute
    waking 3,000 threads, deaf to SIGTERM meanwhile)."""
    import resource
    import signal

    from support import EchoServer, Program, fmt, socks5_connect
    count = 3000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 3 * count + 200:
        pytest.skip("needs %d descriptors (ulimit -Hn is %d)" % (3 * count + 200, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * count + 200)), hard))
    limit = "--max-connections=%d" % (count + 50)
    with EchoServer(backlog=1024) as echo, \
            Program("server", "--transport=dummy", "--dest=" + fmt(echo.address), limit,
                  "127.0.0.1:0") as server, \
            Program("client", "--transport=dummy", limit, "127.0.0.1:0") as client:
        socks = [socks5_connect(client.address, server.address) for _ in range(count)]
        time.sleep(3 * proxy.PARK_AFTER)                 # all quiet: parked
        for sock in socks:
            sock.close()
        began = time.monotonic()
        for each in (client, server):
            each.process.send_signal(signal.SIGTERM)
        for each in (client, server):
            each.process.wait(30)
        took = time.monotonic() - began
        print("\nSIGTERM during the close of %d tunnels: both exited in %.2f s" % (count, took))
        assert took < 5, "exit took %.1f s" % took
