"""A test CA and a leaf certificate for wt.test, made with the ``openssl`` command.

    make_ca(directory) -> namespace(ca_file, cert_file, key_file)

The leaf's subjectAltName is DNS:wt.test and IP:127.0.0.1, so a client may dial
127.0.0.1 with servername wt.test (nginx tests) or verify wt.test in memory.
Both certificates carry the extensions Python 3.13's strict X.509 checks ask
for (CA basicConstraints and keyUsage critical, key identifiers). P-256 keys:
quick to make. Trust the CA with SSL_CERT_FILE=ca_file, or load it into a context.
"""

import subprocess
from pathlib import Path
from types import SimpleNamespace

NAME = "wt.test"


def _openssl(*args, cwd):
    subprocess.run(("openssl",) + args, cwd=str(cwd), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_ca(directory):
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "3650",
             "-subj", "/CN=webtunnel test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-addext", "subjectKeyIdentifier=hash", cwd=directory)
    _openssl("req", *key, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=" + NAME,
             cwd=directory)
    (directory / "leaf.ext").write_text(
        "subjectAltName=DNS:%s,IP:127.0.0.1\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid:always\n" % NAME)
    _openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "3650", "-extfile", "leaf.ext", "-out", "leaf.pem",
             cwd=directory)
    return SimpleNamespace(ca_file=str(directory / "ca.pem"), cert_file=str(directory / "leaf.pem"),
                           key_file=str(directory / "leaf.key"))
