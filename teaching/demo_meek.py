"""The demo's walk through meek (``obfsproxy.py demo --transport=meek``).

The demo runs meek over plain HTTP (url=http://127.0.0.1:PORT/, no front, no TLS),
so that every request and answer can be read off the wire: a real client speaks
HTTPS to a front, and all a censor sees of the same exchanges is their TLS records,
whose sizes and rhythm the walk lists too. The walk reads the client's bytes as HTTP
requests and the server's as answers with meek's own reader (meek.MessageReader),
checks that the bodies carry the application's bytes and nothing else, and shows the
polling schedule an idle session follows.
"""

import meek
from outbound import format_address
from teaching.demo_base import MESSAGE, Stage


class MeekStage(Stage):
    """The server on plain HTTP (no options); the client's url= is the server's own
    address, and its SOCKS target a placeholder it never dials (the bridge line's)."""

    PLACEHOLDER = ("192.0.2.3", 2)

    def __init__(self, options, directory, rng=None):
        Stage.__init__(self, options, directory, rng)
        if options:
            raise ValueError("the meek demo takes no options (it serves plain HTTP on "
                             "127.0.0.1 and points url= at it)")
        self.server_options = {}

    def client_side(self, settings, cls, server_config, announce, server_address):
        url = "http://%s/" % format_address(server_address)
        self.server_options = {"url": url}      # the client's, given as the base stage gives them
        settings, _ = Stage.client_side(self, settings, cls, server_config, announce, server_address)
        self.target = self.PLACEHOLDER
        return settings, self.target


def read_all(data, requests):
    reader = meek.MessageReader(requests=requests)
    reader.feed(data)
    messages = []
    while True:
        message = reader.next()
        if message is None:
            return messages, bytes(reader._buffer)
        messages.append(message)


def head_size(wire, message):
    return len(wire) - len(message.body)


def walk_meek(walk):
    requests, rest_c = read_all(walk.c_sent, True)
    answers, rest_s = read_all(walk.s_sent, False)
    walk.check(not rest_c and not rest_s, "bytes on the wire that are not whole HTTP messages")
    walk.check(len(requests) == len(answers), "%d requests but %d answers" % (len(requests), len(answers)))
    walk.title("The first request: a POST shaped like a browser's fetch(), one session id")
    first = walk.c_sent.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    for line in first.split("\r\n"):
        print("    " + line)
    sids = {meek.session_id_of(request) for request in requests}
    walk.check(len(sids) == 1, "more than one session id in one tunnel")
    print("  Every request of the tunnel names the same X-Session-Id; the bridge keeps one "
          "connection to Tor per id.")

    walk.title("Every exchange: the request's body out, the answer's body back")
    print("  %3s  %-12s  %-12s  %s" % ("#", "request body", "answer body", "what it was"))
    up = b"".join(request.body for request in requests)
    down = b"".join(answer.body for answer in answers)
    for number, (request, answer) in enumerate(zip(requests, answers), 1):
        what = "a poll (nothing to send)" if not request.body else "the application's bytes"
        if answer.body:
            what += "; the answer carries the echo"
        print("  %3d  %-12d  %-12d  %s" % (number, len(request.body), len(answer.body), what))
    walk.check(up == MESSAGE, "the request bodies are not the application's bytes")
    walk.check(down == MESSAGE, "the answers' bodies are not the echo")
    print("  The bodies, joined: the message up and the echo down, byte for byte (checked).")
    if requests:
        request_head = (len(walk.c_sent) - len(up)) / len(requests)
        answer_head = (len(walk.s_sent) - len(down)) / len(answers)
        print("  Each request costs a head of %.0f bytes, each answer %.0f (Go's fields); with TLS "
              "each is also cut into records of at most 16 KiB + 22 bytes." % (request_head, answer_head))
    print("  This demo runs over http:// so that the walk can read it: a string filter matches "
          "everything (below). Over https:// a censor sees TLS records of these sizes, no more.")

    walk.title("When there is nothing to send: the polling rhythm")
    schedule = meek.PollSchedule()
    waits = [schedule.after(0, 0) for _ in range(12)]
    print("  After an exchange that moved bytes, the next request goes at once; then an idle")
    print("  session polls after " + ", ".join("%.2f" % wait for wait in waits[:10]) + " ... s,")
    print("  at most %.0f s apart, and back to %.1f s as soon as bytes move. That rhythm, and"
          % (meek.POLL_MAX, meek.POLL_INITIAL))
    print("  bodies of at most %d bytes, are what a censor can measure through TLS." % meek.MAX_PAYLOAD)
    walk.observed = "meek"


OBSERVER = (["see the front's name (DNS, SNI) and address, and the ClientHello (Chrome's with "
             "curl_cffi, else Python's OpenSSL one)",
             "see a long series of requests and answers, each body at most 64 KiB, whose sizes "
             "follow Tor's cells, and the idle rhythm: 100 ms, 150 ms, 225 ms ... 5 s, back to "
             "100 ms on data",
             "block the front, at the cost of everything it serves (a CDN: the point of fronting)"],
            ["read the URL's host (in Host, inside TLS), the path, the session id or a byte",
             "flag it as fully encrypted: it is TLS",
             "confirm the bridge by probing the front without the URL: the front answers for its "
             "own sites; the bridge itself answers like a small Go web server"])
