"""Certificates the HTTPS tests make: a private CA of the test's own (trusted by nothing else, as a self-signed
server's is) and a server certificate it issued for 127.0.0.1 and localhost."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import trustme

from servescope.sim.launcher import SimHandle, start_sim


def make_certs(d: Path) -> tuple[Path, Path, Path]:
    """Write `ca.pem` (the CA: what --ca-cert takes), `cert.pem` (the server's chain) and `key.pem` into `d`;
    returns the three paths in that order."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    (d / "cert.pem").write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
    return d / "ca.pem", d / "cert.pem", d / "key.pem"


@contextlib.contextmanager
def tls_simulator(d: Path, args: list[str]) -> Iterator[tuple[SimHandle, Path]]:
    """Certificates made into `d`, then the tiny simulator with `args` serving HTTPS with them: it and the CA's path
    (what --ca-cert takes)."""
    ca, cert, key = make_certs(d)
    with start_sim("tiny", [*args, "--tls-cert", str(cert), "--tls-key", str(key)]) as h:
        yield h, ca
