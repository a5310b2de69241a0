"""nginx as the TLS front of a webtunnel bridge, started by the tests and the benchmark.

    client --TLS--> nginx --plain HTTP, the secret path only--> webtunnel server --> Tor
                      \\-- every other path: the cover page (200)

``SERVER_BLOCK`` is the one configuration the README gives operators (print it with
``python3 tests/nginx.py``): TLS with the site's certificate, an exact-match
``location`` for the secret path proxied to the bridge with the Upgrade handshake
passed through, long timeouts for idle tunnels, no access log, and a cover page on
every other path. The tests and the benchmark run that same block inside
``MAIN``, which only makes nginx an ordinary child process: in the foreground
(``daemon off``), one process (``master_process off``: no workers switching to
another user, one PID to measure), and every file it writes (pid, error log,
temporary directories) in its own directory, started as ``nginx -p DIR -c
DIR/nginx.conf``.

``Nginx(directory, backend, cert_file, key_file)`` starts it on a free port of
127.0.0.1 and returns once that port accepts connections; ``stop()`` ends it
and reaps it; ``error_log()`` is its error log (the tests print it when they
fail). Debian's package is ``nginx-light``; ``require_nginx()`` fails a test in
CI when it is missing (.ci/run installs it) and skips it elsewhere, saying how
to install it.
"""

import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

IN_CI = os.environ.get("CI") == "true"
INSTALL = "apt-get install nginx-light"

# What operators put in their nginx configuration (inside http { }), and what the
# tests run. Placeholders: listen, server_name, cert_file, key_file, path, backend.
SERVER_BLOCK = """\
server {{
    listen {listen} ssl;
    server_name {server_name};
    ssl_certificate {cert_file};
    ssl_certificate_key {key_file};
    ssl_protocols TLSv1.2 TLSv1.3;  # nginx 1.22 alone offers TLS 1.2 only; browsers expect 1.3
    access_log off;                 # keep no record of who visited
    server_tokens off;              # error pages without the nginx version

    # The secret path of the bridge line's url=, and nothing else, goes to the bridge.
    location = {path} {{
        proxy_pass http://{backend};              # no URI: the path passes unchanged
        proxy_http_version 1.1;                   # an Upgrade needs HTTP/1.1 to the bridge
        proxy_set_header Upgrade $http_upgrade;   # hop-by-hop headers pass only when set here
        proxy_set_header Connection "upgrade";
        proxy_set_header Host $host;
        # The address of the connecting client, for Tor's Extended ORPort (USERADDR).
        # Not $proxy_add_x_forwarded_for: the bridge takes the first element, which
        # that variable would let the client write.
        proxy_set_header X-Forwarded-For $remote_addr;
        proxy_read_timeout 1d;                    # an idle tunnel stays up
        proxy_send_timeout 1d;
    }}

    # The cover site: every other path. A real site's pages are better cover.
    location / {{
        default_type text/html;
        return 200 "{cover}";
    }}
}}
"""

# The same for a meek bridge (meek.py): the POSTs to the path go to the bridge over
# keep-alive connections (one of them carries requests of many sessions), with the
# client's address; the answer passes on as it comes (a poll waits for Tor's bytes).
MEEK_SERVER_BLOCK = """\
upstream meek_bridge {{
    server {backend};
    keepalive 32;                   # idle keep-alive connections kept to the bridge
    keepalive_timeout 15s;          # under the bridge's 20 s (Go's): nginx lets go first
}}
server {{
    listen {listen} ssl;
    server_name {server_name};
    ssl_certificate {cert_file};
    ssl_certificate_key {key_file};
    ssl_protocols TLSv1.2 TLSv1.3;
    access_log off;
    server_tokens off;

    location = {path} {{
        proxy_pass http://meek_bridge;
        proxy_http_version 1.1;                   # keep-alive to the bridge needs HTTP/1.1 ...
        proxy_set_header Connection "";           # ... and no "Connection: close"
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $remote_addr;   # for Tor's Extended ORPort
        proxy_buffering off;
        client_body_buffer_size 128k;             # a 64 KiB body stays in memory, not a file
    }}

    location / {{
        default_type text/html;
        return 200 "{cover}";
    }}
}}
"""

COVER = "<html><body><h1>Welcome</h1></body></html>\\n"

# nginx as a child process of the tests: the foreground, one process, its files in {dir}.
MAIN = """\
daemon off;
master_process off;
pid {dir}/nginx.pid;
lock_file {dir}/nginx.lock;
error_log {dir}/error.log info;
worker_rlimit_nofile 16384;
events {{
    worker_connections 8192;
}}
http {{
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{server}}}
"""

# What the README shows: the block with an operator's values.
EXAMPLE = dict(listen="443", server_name="example.org", cert_file="/etc/ssl/example.org/fullchain.pem",
               key_file="/etc/ssl/example.org/privkey.pem", path="/k7Qm2Zx1c1b00b6",
               backend="127.0.0.1:15000", cover=COVER)


# Other fronts operators write (tests only; VARIANTS[name] replaces the proxy_pass line
# of SERVER_BLOCK, and "location" replaces its location line). Our server serves the
# first two when told the path they pass (bridge-path=), and refuses a rewrite to another
# path unless told so too; "every path" is a front that passes the bridge everything.
VARIANTS = {
    # location = /SECRET { proxy_pass http://H:P/; }: nginx passes "/" on
    "trailing slash": dict(proxy_pass="proxy_pass http://{backend}/;"),
    # url=https://HOST/bridge/SECRET, location /bridge/ { proxy_pass http://H:P/; }: "/SECRET"
    "prefix location": dict(location="location /bridge/ {{", proxy_pass="proxy_pass http://{backend}/;"),
    # a rewrite to a path of its own: "/ws"
    "rewrite": dict(proxy_pass="rewrite ^ /ws break;\n        proxy_pass http://{backend};"),
    # a regular expression every path matches, ahead of the cover's "location /"
    "every path": dict(location="location ~ ^/ {{"),
    # https:// to our plain-HTTP port (newcomer-4 D4)
    "https upstream": dict(proxy_pass="proxy_pass https://{backend};"),
}


def find_nginx():
    """The nginx binary (PATH, then Debian's /usr/sbin), or None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def require_nginx():
    """The nginx binary. In CI its absence fails the test (.ci/run installs it);
    elsewhere the test is skipped, saying how to install it."""
    import pytest
    found = find_nginx()
    if found is None:
        if IN_CI:
            pytest.fail("nginx is not installed, but CI must install it (.ci/run: %s)" % INSTALL)
        pytest.skip("nginx is not installed (%s); this test puts a real nginx in front of "
                    "the webtunnel server, and CI installs it" % INSTALL)
    return found


def free_port():
    """A port of 127.0.0.1 free now, from 20000-32767: below the kernel's range of
    source ports, so no outgoing connection takes it before nginx binds it."""
    while True:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", random.randint(20000, 32767)))
            except OSError:
                continue
            return sock.getsockname()[1]


def indent(text, spaces=4):
    return "".join(" " * spaces + line if line.strip() else line
                   for line in text.splitlines(True))


class NginxError(Exception):
    """nginx did not start; the message holds its error log."""


class Nginx:
    """nginx in front of ``backend`` (host, port), with TLS from ``cert_file`` and
    ``key_file``, the secret ``path`` proxied and the cover page elsewhere.
    ``address``: where it listens; ``url``: the https URL of the secret path."""

    TRIES = 3              # a port taken between free_port() and nginx's bind(): try another
    START_SECONDS = 20.0

    def __init__(self, directory, backend, cert_file, key_file, path="/SECRET",
                 server_name="wt.test", binary=None, variant=None, block=None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.binary = binary or find_nginx()
        if self.binary is None:
            raise NginxError("nginx is not installed (%s)" % INSTALL)
        self.backend, self.path = backend, path
        self.settings = dict(server_name=server_name, cert_file=cert_file, key_file=key_file,
                             path=path, backend="%s:%d" % tuple(backend[:2]), cover=COVER)
        self.process = None
        self.variant = variant
        self.block = block or SERVER_BLOCK     # MEEK_SERVER_BLOCK for a meek bridge
        for _ in range(self.TRIES):
            if self._start(free_port()):
                return
        raise NginxError("nginx could not start %d times; its error log:\n%s"
                         % (self.TRIES, self.error_log()))

    @property
    def url(self):
        return "https://127.0.0.1:%d%s" % (self.address[1], self.path)

    def _start(self, port):
        """Start on ``port``; True once it accepts, False if the port was taken."""
        self.address = ("127.0.0.1", port)
        server = self.block.format(listen="127.0.0.1:%d" % port, **self.settings)
        if self.variant is not None:
            change = VARIANTS[self.variant]
            lines = server.splitlines(True)
            for i, line in enumerate(lines):
                indent_ = line[:len(line) - len(line.lstrip())]
                if line.lstrip().startswith("proxy_pass ") and "proxy_pass" in change:
                    lines[i] = indent_ + change["proxy_pass"].format(**self.settings) + "\n"
                elif line.lstrip().startswith("location = ") and "location" in change:
                    lines[i] = indent_ + change["location"].format(**self.settings) + "\n"
            server = "".join(lines)
        config = MAIN.format(dir=self.directory, server=indent(server))
        (self.directory / "nginx.conf").write_text(config)
        log = self.directory / "error.log"
        if log.exists():
            log.unlink()
        self.process = subprocess.Popen(
            [self.binary, "-p", str(self.directory), "-c", str(self.directory / "nginx.conf"),
             "-e", str(log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + self.START_SECONDS
        while True:
            if self.process.poll() is not None:
                self.process = None
                if "Address already in use" in self.error_log():
                    return False
                raise NginxError("nginx exited at startup; its error log:\n%s" % self.error_log())
            try:
                socket.create_connection(self.address, timeout=2).close()
                return True
            except OSError:
                pass
            if time.monotonic() > end:
                self.stop()
                raise NginxError("nginx did not accept on %s:%d within %.0f s; its error log:\n%s"
                                 % (self.address + (self.START_SECONDS, self.error_log())))
            time.sleep(0.02)   # polling a real condition (the port accepts), not a sleep for one

    def error_log(self):
        try:
            return (self.directory / "error.log").read_text(errors="replace")
        except OSError as exc:
            return "(no error log: %s)" % exc

    @property
    def pid(self):
        return self.process.pid

    def stop(self, timeout=10.0):
        """SIGTERM (nginx's fast shutdown), then reap it; its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    import sys
    meek = sys.argv[1:] == ["meek"]     # the meek bridge's block
    print((MEEK_SERVER_BLOCK if meek else SERVER_BLOCK).format(
        **dict(EXAMPLE, path="/meek/", backend="127.0.0.1:15001") if meek else EXAMPLE), end="")
