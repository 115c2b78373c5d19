"""HTTPS for every request servescope sends: one TLS setting per run, the SSL contexts made from it, the one-line
error for a certificate the client does not trust, and the log of the load's connections (how long each took to
open, TCP and TLS handshake apart).

- `TlsSettings`: system trust (the default), a private or self-signed CA (`--ca-cert PATH`, its PEM text read once,
  so that worker processes and Ray nodes need no file), or no verification (`--insecure`). `configure()` makes one
  the process's setting, which every client takes unless given another (`ssl_context()`): the probe, /tokenize,
  /metrics, the health checks, the quality probe and the load's transports. The load's options carry it too
  (`ClientOptions.tls`), across worker processes and Ray actors.
- `cert_problem()`: a connection that failed on the server's certificate -> one line naming the problem and the
  two flags.
- `CONNECTIONS`: every connection the load's transports open is logged (connect and TLS handshake ms); a cell
  reads its own part (`mark()`, `since()`), which says how many connections it opened (one per user when
  keep-alive works, not one per request) and what the handshakes cost, apart from the TTFT.

Light to import (`ssl` only when a context is made): engine/spec.py reads --ca-cert with `ca_cert_path`."""

from __future__ import annotations

import functools
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servescope.core.errors import ServescopeError

if TYPE_CHECKING:
    import ssl

__all__ = ["CONNECTIONS", "ConnLog", "ConnSample", "TlsSettings", "ca_cert_path", "cert_problem", "configure",
           "context", "current", "handshake_figures", "ssl_context"]

_PEM_CERT = "-----BEGIN CERTIFICATE-----"
CA_HOW = "give the PEM file of the CA that signed the server's certificate"


def ca_cert_path(raw: object, where: str) -> str | None:
    """--ca-cert / `[target] ca_cert`: a readable PEM file holding at least one certificate, made absolute (a
    resumed sweep finds it from any directory); one line naming `where` otherwise."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ServescopeError(f"{where}: must be a path to a PEM file, got {raw!r}")
    v = raw.strip()
    if not v:
        raise ServescopeError(f"{where}: empty; {CA_HOW} (or leave it out for the system's trusted CAs)")
    p = Path(v).expanduser()
    if not p.exists():
        raise ServescopeError(f"{where} {v}: no such file; {CA_HOW}")
    if not p.is_file():
        raise ServescopeError(f"{where} {v}: not a file; {CA_HOW}")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ServescopeError(f"{where} {v}: cannot read it ({e.strerror or e}); {CA_HOW}") from None
    if _PEM_CERT not in text:
        raise ServescopeError(f"{where} {v}: no PEM certificate in it (no '{_PEM_CERT}' line); {CA_HOW}")
    return str(p.resolve())


@dataclass(frozen=True)
class TlsSettings:
    """How servescope checks an HTTPS server: `verify` False checks nothing (--insecure); else against
    `ca_pem` (the CA file's text, from `ca_cert`, the path as given) when given, else the system's CAs."""

    verify: bool = True
    ca_cert: str | None = None
    ca_pem: str | None = None

    @classmethod
    def load(cls, ca_cert: str | None = None, verify: bool = True) -> TlsSettings:
        """The settings of --ca-cert and --insecure (`verify` False); the CA file is read now, and checked: a
        file OpenSSL cannot load is one line naming it."""
        if not verify:
            return cls(verify=False)
        if ca_cert is None:
            return cls()
        path = ca_cert_path(ca_cert, "--ca-cert")
        assert path is not None
        pem = Path(path).read_text(encoding="utf-8", errors="replace")
        settings = cls(ca_cert=path, ca_pem=pem)
        try:
            context(settings)
        except Exception as e:  # ssl.SSLError: not a certificate OpenSSL reads
            raise ServescopeError(f"--ca-cert {ca_cert}: OpenSSL cannot load it ({e}); {CA_HOW}") from None
        return settings

    @property
    def text(self) -> str:
        """How the setting reads in a header or a report: `system CAs`, `CA ca.pem`, `not verified (--insecure)`."""
        if not self.verify:
            return "not verified (--insecure)"
        return f"CA {Path(self.ca_cert).name}" if self.ca_cert else "system CAs"


@functools.cache
def context(settings: TlsSettings) -> ssl.SSLContext:
    """The client SSL context of `settings`, made once per setting: loading the system CA bundle costs ~0.1 s of
    CPU, too much to pay per health check."""
    import ssl

    if not settings.verify:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if settings.ca_pem is not None:
        return ssl.create_default_context(cadata=settings.ca_pem)
    return ssl.create_default_context()


_current = TlsSettings()
_said_insecure = False


def configure(settings: TlsSettings) -> None:
    """Make `settings` this process's TLS setting (the sweep's --ca-cert / --insecure), for every client made
    from now on. Turning verification off is said once on stderr."""
    global _current, _said_insecure
    _current = settings
    if not settings.verify and not _said_insecure:
        _said_insecure = True
        print("servescope: warning: --insecure: the server's TLS certificate is not verified (anyone on the way "
              "can read and change the traffic); the session records tls_verify = false", file=sys.stderr)


def current() -> TlsSettings:
    return _current


def ssl_context(settings: TlsSettings | None = None) -> ssl.SSLContext:
    """The SSL context of `settings`, else of this process's setting."""
    return context(settings or _current)


# --- a certificate the client does not trust ---------------------------------------------------------------


def cert_error(e: BaseException | None) -> BaseException | None:
    """The certificate verification error under `e` (its causes, contexts and arguments, as the transports wrap
    it): an ssl.SSLCertVerificationError when there is one, else the first error whose text says
    CERTIFICATE_VERIFY_FAILED; None when the failure is not the certificate's."""
    import ssl

    seen: set[int] = set()
    stack, texts = [e], []
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, ssl.SSLCertVerificationError):
            return x
        if "CERTIFICATE_VERIFY_FAILED" in str(x) or "certificate verify failed" in str(x):
            texts.append(x)
        stack += [x.__cause__, x.__context__, *(a for a in x.args if isinstance(a, BaseException))]
    return texts[0] if texts else None


def cert_problem(where: str, e: BaseException) -> ServescopeError | None:
    """One line for a connection to `where` that failed on the server's certificate; None for any other error."""
    import re
    import ssl

    x = cert_error(e)
    if x is None:
        return None
    why = x.verify_message if isinstance(x, ssl.SSLCertVerificationError) and x.verify_message else ""
    if not why:
        text = str(x)
        why = text.split("certificate verify failed:", 1)[1] if "certificate verify failed:" in text else text
    why = re.sub(r"\s*\(_ssl\.c:\d+\)", "", why).strip(" ()[]") or "certificate verify failed"
    hint = ("the CA given with --ca-cert did not sign it; give the right CA" if _current.ca_pem is not None else
            "give its CA's certificate with --ca-cert PATH")
    return ServescopeError(f"{where}: the server's TLS certificate is not trusted ({why}); {hint}, or --insecure to "
                           "skip verification")


# --- the load's connections ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnSample:
    """One connection the load opened: TCP connect (ms) and TLS handshake (ms; None: plain HTTP, or a transport
    that times them together, then in `connect_ms`)."""

    connect_ms: float
    tls_ms: float | None = None


class ConnLog:
    """Every connection the load's transports open in this process (worker processes' come back with their
    results: `extend`). Thread-safe; a cell reads what it opened with `mark()` before and `since(mark)` after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: list[ConnSample] = []
        self._base = 0  # samples dropped from the front

    def add(self, sample: ConnSample) -> None:
        with self._lock:
            self._samples.append(sample)

    def extend(self, samples: list[ConnSample] | tuple[ConnSample, ...]) -> None:
        with self._lock:
            self._samples.extend(samples)

    def mark(self) -> int:
        with self._lock:
            return self._base + len(self._samples)

    def since(self, mark: int) -> list[ConnSample]:
        with self._lock:
            return self._samples[max(0, mark - self._base):]

    def take(self, mark: int) -> list[ConnSample]:
        """What was logged since `mark`, removed from the log (a worker sends it to its driver, which logs it
        again: once, even when the worker runs in the driver's own process)."""
        with self._lock:
            cut = max(0, mark - self._base)
            out = self._samples[cut:]
            del self._samples[cut:]
            return out

    def forget(self, mark: int) -> None:
        """Drop what was logged before `mark` (a long session does not keep every cell's connections)."""
        with self._lock:
            cut = max(0, min(len(self._samples), mark - self._base))
            del self._samples[:cut]
            self._base += cut


CONNECTIONS = ConnLog()


@dataclass(frozen=True)
class HandshakeFigures:
    """What a cell's connections cost: how many it opened, the TCP connect p50 (ms) and the TLS handshake p50
    (ms; None over plain HTTP)."""

    opened: int
    connect_ms_p50: float | None
    tls_handshake_ms_p50: float | None


def handshake_figures(samples: list[ConnSample]) -> HandshakeFigures:
    import statistics

    connect = [s.connect_ms for s in samples]
    tls = [s.tls_ms for s in samples if s.tls_ms is not None]
    return HandshakeFigures(len(samples), round(statistics.median(connect), 3) if connect else None,
                            round(statistics.median(tls), 3) if tls else None)


async def measure_handshakes(url: str, settings: TlsSettings | None = None, n: int = 3,
                             timeout_s: float = 10.0) -> HandshakeFigures | None:
    """Open `n` fresh connections to `url`'s server, one after another, and time each one's TCP connect and (https)
    TLS handshake, then close it: the network's and TLS's share of a first request's latency, measured apart from
    any request. None when a connection fails (the probe's own request says why)."""
    import asyncio
    import time
    from urllib.parse import urlsplit

    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        return None
    host, port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
    ctx = ssl_context(settings) if u.scheme == "https" else None
    loop = asyncio.get_running_loop()
    samples: list[ConnSample] = []
    try:
        async with asyncio.timeout(timeout_s):
            for _ in range(max(1, n)):
                t0 = time.perf_counter_ns()
                transport, proto = await loop.create_connection(asyncio.Protocol, host, port)
                t1 = time.perf_counter_ns()
                try:
                    if ctx is not None:
                        transport = await loop.start_tls(transport, proto, ctx, server_hostname=host) or transport
                    t2 = time.perf_counter_ns()
                finally:
                    transport.close()
                samples.append(ConnSample((t1 - t0) / 1e6, (t2 - t1) / 1e6 if ctx is not None else None))
    except (OSError, TimeoutError):
        return None
    return handshake_figures(samples)


def target_tls_text(verify: bool | None, handshake_ms: float | None = None, connect_ms: float | None = None,
                    ca: str | None = None) -> str:
    """A session's [target] TLS figures -> its TLS part for a report's target line: `TLS handshake p50 4.1 ms,
    connect p50 0.3 ms, CA ca.pem`, `..., certificate not verified (--insecure)`; '' for a plain-HTTP target or
    an older session (`verify` None: not recorded)."""
    if verify is None:
        return ""
    parts = []
    if handshake_ms is not None:
        parts.append(f"TLS handshake p50 {handshake_ms:,.1f} ms")
    if connect_ms is not None:
        parts.append(f"connect p50 {connect_ms:,.1f} ms")
    if verify is False:
        parts.append("certificate not verified (--insecure)")
    else:
        parts.append(f"CA {ca}" if ca else "system CAs")
    return ", ".join(parts)


def reuse_problem(opened: int, users: int, requests: int) -> str:
    """A closed-loop cell whose load opened many more connections than it had users (`opened` for `requests`
    from `users`): one line saying keep-alive did not hold; '' when it did (about one connection per user, a few
    more for connections the server closed while idle)."""
    users = max(1, min(users, requests)) if requests else max(1, users)
    if opened <= 2 * users + 2:
        return ""
    return (f"opened {opened:,} connections for {requests:,} requests from {users:,} users: the server did not keep "
            "them alive, so many requests' TTFT includes a new TCP and TLS handshake (see the target line's "
            "handshake time)")
