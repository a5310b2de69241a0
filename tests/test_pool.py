"""pool.py, the transports' ``prepare`` hooks, and the listener's pools (proxy.Pools).

A pool hands out single-use handshake material (obfs4/obfs3 keypairs, obfs2 first
messages) made by a background thread while the proxy is idle. What must hold:
every item goes to one connection only; the stock never grows past its size; an
empty pool gives nothing (the connection then does its own key work, inside the
key-work slot); nothing is made while the owner says it is busy; a full pool's
thread ends, so a proxy at rest runs none; and a side built from pooled material
speaks its protocol with a plain side.
"""

import threading
import time

import pytest
from support import wait_until

import handshake_scheduler
import listener
import obfs2
import obfs3
import obfs4
import pool
import proxy
import transports


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
    given = [item for item in taken if item is not None]
    assert len(set(given)) == len(given) >= 4      # never the same item twice
    assert stock.hits == len(given) and stock.hits + stock.misses == 10
    stock.close()


def test_an_empty_pool_gives_nothing_and_makes_nothing_on_the_spot():
    """The connection's own key work then runs in the key-work slot, where a flood
    of connections is serialised (an item made here would run outside it)."""
    gate = threading.Event()
    make = Counter()
    stock = pool.Pool(make, size=3, idle=gate.is_set, name="t2")
    assert stock.take() is None and stock.misses == 1 and stock.hits == 0
    assert make.made == 0
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
    assert stock.take() is None                    # still answers: nothing


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
    assert stock.take() is None and stock.misses == 1


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
    key, make = obfs4.Obfs4.prepare(True, client_config)
    assert obfs4.Obfs4.prepare(False, server_config)[0] == key     # one pool serves both sides
    keypair = make()
    client = obfs4.Obfs4(True, client_config, keypair)
    assert client.start()[:32] == keypair[2]                 # X' on the wire is the pooled one
    server = obfs4.Obfs4(False, server_config, make())
    assert server_config.keypairs is None                    # the listener's config is untouched
    talk(obfs4.Obfs4(True, obfs4_configs()[0], make()), server)


def test_obfs4_without_a_pooled_keypair_makes_its_own_only_when_the_core_lets_it():
    """Key generation is in start() (client) and in the receive() that verified
    MAC_C (server): the core runs both in the key-work slot. Making one side
    does no key work at all."""
    client_config, server_config = obfs4_configs()
    made = []
    for config in (client_config, server_config):
        config.keypairs = lambda: made.append(1) or obfs4.generate_keypair()
    client, server = obfs4.Obfs4(True, client_config), obfs4.Obfs4(False, server_config)
    assert made == []
    hello = client.start()
    assert made == [1]
    assert server.receive(hello[:40]) == b"" and made == [1]      # a prober's bytes: no key work
    talk_from(client, server, hello[40:])
    assert made == [1, 1]


def talk_from(client, server, rest):
    server.receive(rest)
    client.receive(server.data_to_send())
    assert server.receive(client.send(b"up")) == b"up"
    assert client.receive(server.send(b"down")) == b"down"


def test_pooled_obfs3_sides_use_the_pooled_keypair_and_talk():
    key, make = obfs3.Obfs3.prepare(False, obfs3.Obfs3Config())
    keypair = make()
    side = obfs3.Obfs3(True, obfs3.Obfs3Config(), keypair)
    assert side.start()[:192] == keypair[1]
    talk(obfs3.Obfs3(True, obfs3.Obfs3Config(), make()), obfs3.Obfs3(False))


@pytest.mark.parametrize("secret", [None, b"s3cret"])
@pytest.mark.parametrize("pooled_side", ["client", "server"])
def test_a_pooled_obfs2_side_sends_the_prepared_message_and_talks(secret, pooled_side):
    config = obfs2.Config(secret, hash_iterations=10)
    initiator = pooled_side == "client"
    recipe = obfs2.Obfs2.prepare(initiator, config)
    if secret and not initiator:
        assert recipe is None            # a secret responder answers only checked clients
        return
    key, make = recipe
    seed, padlen, message = prepared = make()
    side = obfs2.Obfs2(initiator, config, prepared)
    assert side.seed == seed and side.padlen == padlen and side.handshake() == message
    other = obfs2.Obfs2(not initiator, config)
    if initiator:
        talk(side, other)
    else:
        talk(other, side)


def test_obfs2_pools_are_per_role_and_secret():
    keys = {obfs2.Obfs2.prepare(initiator, obfs2.Config(secret, 10))[0]
            for initiator in (True, False) for secret in (None, b"a")
            if obfs2.Obfs2.prepare(initiator, obfs2.Config(secret, 10))}
    assert len(keys) == 3
    assert not hasattr(transports.Dummy, "prepare")


# --- The proxy ----------------------------------------------------------------------

def test_key_work_is_idle_only_after_a_quiet_spell(monkeypatch):
    monkeypatch.setattr(handshake_scheduler, "QUIET_SECONDS", 0.05)
    work = handshake_scheduler.KeyWork()
    assert work.idle()
    work.begin()
    assert not work.idle()                               # a handshake is under way
    work.end()
    assert not work.idle()                               # ... and just ended
    wait_until(work.idle, what="idle after the quiet spell")


def test_a_listener_gets_a_pool_and_its_connections_take_from_it():
    server = listener.Listener(pool_size=3)
    settings = proxy.Settings(transport="obfs3", config=obfs3.Obfs3Config(), dest=("127.0.0.1", 1))
    server.listen(("127.0.0.1", 0), proxy.handle_server, settings)
    (stock,) = server.pools._pools.values()
    wait_until(lambda: len(stock) == 3, what="the listener's pool full")
    side = settings.new_transport(False, settings.config, server.pools)
    side.start()
    assert stock.hits == 1
    server.pools.close()
    server.listeners[0][0].close()


def test_pool_size_zero_makes_no_pools():
    server = listener.Listener(pool_size=0)
    server.listen(("127.0.0.1", 0), proxy.handle_socks_client, proxy.Settings(transport="obfs4"))
    assert server.pools._pools == {}
    assert server.pools.take(obfs4.Obfs4, True, None) is None
    server.listeners[0][0].close()
