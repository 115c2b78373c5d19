"""core/tls.py: the TLS setting (--ca-cert, --insecure), the one-line certificate error, the connection log, and
the TLS options of the sweep (engine/spec.py) and of the session (engine/sessionmeta.py, the report's target line)."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest
import trustme

from servescope.core import tls
from servescope.core.errors import ServescopeError
from servescope.core.tls import CONNECTIONS, ConnLog, ConnSample, TlsSettings, ca_cert_path, cert_problem
from servescope.engine.spec import SweepConflict, SweepSpec, add_flags


@pytest.fixture
def ca_pem(tmp_path: Path) -> Path:
    p = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(p))
    return p


@pytest.fixture(autouse=True)
def _restore_setting() -> object:
    before = tls.current()
    yield None
    tls._current = before


def test_ca_cert_path(tmp_path: Path, ca_pem: Path) -> None:
    assert ca_cert_path(str(ca_pem), "--ca-cert") == str(ca_pem.resolve())
    assert ca_cert_path(None, "--ca-cert") is None
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    for raw, message in ((str(tmp_path / "nope.pem"), "no such file"), (str(tmp_path), "not a file"),
                         (str(junk), "no PEM certificate in it"), (" ", "empty"), (3, "must be a path")):
        with pytest.raises(ServescopeError) as e:
            ca_cert_path(raw, "--ca-cert")
        assert e.value.message.startswith("--ca-cert") and message in e.value.message
        assert "\n" not in e.value.message


def test_settings_and_contexts(tmp_path: Path, ca_pem: Path) -> None:
    system = TlsSettings.load()
    assert system == TlsSettings() and system.text == "system CAs"
    ctx = tls.context(system)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert tls.context(TlsSettings()) is ctx  # made once per setting
    own = TlsSettings.load(str(ca_pem))
    assert own.ca_pem is not None and own.text == "CA ca.pem"
    assert len(tls.context(own).get_ca_certs()) == 1  # that CA alone, not the system's
    off = TlsSettings.load(str(ca_pem), verify=False)
    assert off == TlsSettings(verify=False) and off.text == "not verified (--insecure)"
    assert tls.context(off).verify_mode == ssl.CERT_NONE and not tls.context(off).check_hostname
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    with pytest.raises(ServescopeError, match=r"^--ca-cert .*broken.pem: OpenSSL cannot load it"):
        TlsSettings.load(str(broken))


def test_configure_says_insecure_once(capsys: pytest.CaptureFixture[str]) -> None:
    tls._said_insecure = False
    tls.configure(TlsSettings(verify=False))
    tls.configure(TlsSettings(verify=False))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("servescope: warning: --insecure:") and "tls_verify = false" in err[0]
    assert tls.current() == TlsSettings(verify=False)
    assert tls.ssl_context().verify_mode == ssl.CERT_NONE


def _verify_error(message: str = "self-signed certificate") -> ssl.SSLCertVerificationError:
    e = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message} "
                                        "(_ssl.c:1006)")
    e.verify_message = message
    return e


def test_cert_problem_is_one_line_naming_both_flags() -> None:
    import httpx

    try:
        try:
            raise _verify_error()
        except ssl.SSLError as inner:
            raise httpx.ConnectError(str(inner)) from inner
    except httpx.ConnectError as outer:
        e = cert_problem("https://api.example", outer)
    assert e is not None
    assert e.message == ("https://api.example: the server's TLS certificate is not trusted (self-signed certificate); "
                         "give its CA's certificate with --ca-cert PATH, or --insecure to skip verification")
    # a transport that kept only the text
    text = cert_problem("https://x", OSError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                                             "unable to get local issuer certificate (_ssl.c:1006)"))
    assert text is not None and "(unable to get local issuer certificate);" in text.message
    assert cert_problem("https://x", ConnectionRefusedError(111, "Connection refused")) is None


def test_cert_problem_with_a_ca_given(ca_pem: Path) -> None:
    tls.configure(TlsSettings.load(str(ca_pem)))
    e = cert_problem("https://x", _verify_error("unable to get local issuer certificate"))
    assert e is not None and "the CA given with --ca-cert did not sign it" in e.message


def test_conn_log() -> None:
    log = ConnLog()
    log.add(ConnSample(1.0))
    m = log.mark()
    log.extend([ConnSample(2.0, 3.0), ConnSample(4.0, 5.0)])
    assert log.since(m) == [ConnSample(2.0, 3.0), ConnSample(4.0, 5.0)]
    log.forget(m)
    assert log.since(0) == log.since(m) and log.mark() == m + 2
    m2 = log.mark()
    log.add(ConnSample(6.0))
    assert log.take(m2) == [ConnSample(6.0)] and log.mark() == m2  # taken away: its driver logs it again
    figures = tls.handshake_figures([ConnSample(1.0, 10.0), ConnSample(3.0, 30.0), ConnSample(2.0, None)])
    assert (figures.opened, figures.connect_ms_p50, figures.tls_handshake_ms_p50) == (3, 2.0, 20.0)
    assert tls.handshake_figures([]).opened == 0
    assert isinstance(CONNECTIONS, ConnLog)


def test_target_tls_text() -> None:
    assert tls.target_tls_text({"url": "http://x"}) == ""
    assert tls.target_tls_text(None) == ""
    assert tls.target_tls_text({"tls_verify": True, "tls_handshake_ms": 12.345, "connect_ms": 1.0}) == \
        "TLS handshake p50 12.3 ms, connect p50 1.0 ms, system CAs"
    assert tls.target_tls_text({"tls_verify": True, "tls_ca": "ca.pem"}) == "CA ca.pem"
    assert tls.target_tls_text({"tls_verify": False, "tls_handshake_ms": 2}) == \
        "TLS handshake p50 2.0 ms, certificate not verified (--insecure)"


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p)
    return p.parse_args(list(argv))


HTTPS = "https://api.example:443"


def test_spec_options(ca_pem: Path) -> None:
    default = SweepSpec.from_args(_args())
    assert default.ca_cert is None and default.tls_verify is None
    assert "ca_cert" not in default.to_table()["target"] and "tls_verify" not in default.to_table()["target"]  # type: ignore[operator]
    assert default.tls_settings() == TlsSettings()
    off = SweepSpec.from_args(_args("--url", HTTPS, "--insecure"))
    assert off.tls_verify is False and off.to_table()["target"]["tls_verify"] is False  # type: ignore[index]
    assert off.tls_settings() == TlsSettings(verify=False)
    own = SweepSpec.from_args(_args("--url", HTTPS, "--ca-cert", str(ca_pem)))
    assert own.to_table()["target"]["ca_cert"] == str(ca_pem.resolve())  # type: ignore[index]
    assert SweepSpec.from_table(own.to_table()) == own  # a session's [sweep] resumes with it
    assert own.tls_settings().ca_pem == ca_pem.read_text()
    with pytest.raises(SweepConflict, match="not both") as e:
        SweepSpec.from_args(_args("--ca-cert", str(ca_pem), "--insecure"))
    assert e.value.fields == ("tls_verify", "ca_cert")
    with pytest.raises(ServescopeError, match=r"^--ca-cert /no/such.pem: no such file"):
        SweepSpec.from_args(_args("--ca-cert", "/no/such.pem"))
    with pytest.raises(ServescopeError, match="sweep: \\[target\\] tls_verify"):
        SweepSpec.from_table({"target": {"tls_verify": "maybe"}})
    for flags in (["--insecure"], ["--ca-cert", str(ca_pem)]):  # over plain HTTP (or the simulator) a mistake
        for url in ("http://127.0.0.1:8000", "sim://tiny"):
            with pytest.raises(SweepConflict, match=f"says how an https:// server's certificate is checked, but the "
                                                    f"URL {url} has no TLS") as e:
                SweepSpec.from_args(_args("--url", url, *flags))
            assert e.value.fields[1] == "url"


def test_session_meta_records_tls() -> None:
    from servescope.core.target import ModelInfo, TargetInfo
    from servescope.engine.plan import plan_cells
    from servescope.engine.sessionmeta import session_meta

    spec = SweepSpec.from_args(_args("--url", HTTPS, "--insecure", "-n", "2", "-c", "1"))
    target = TargetInfo("https://api.example", [ModelInfo("m")], connect_ms=3.5, tls_handshake_ms=9.25,
                        tls_verify=False)
    meta = session_meta(spec, plan_cells(spec), name="n", label="https://api.example", target=target,
                        model=ModelInfo("m"), tokenizer="t")
    assert meta["target"]["tls_verify"] is False
    assert (meta["target"]["tls_handshake_ms"], meta["target"]["connect_ms"]) == (9.25, 3.5)
    assert "tls_ca" not in meta["target"]
    assert meta["sweep"]["target"]["tls_verify"] is False  # type: ignore[index]
    plain = session_meta(spec, plan_cells(spec), name="n", label="x", target=TargetInfo("http://x", [ModelInfo("m")]),
                         model=ModelInfo("m"), tokenizer="t")
    assert "tls_verify" not in plain["target"] and "tls_handshake_ms" not in plain["target"]


def test_reuse_problem() -> None:
    assert tls.reuse_problem(4, 4, 100) == ""
    assert tls.reuse_problem(10, 4, 100) == ""  # a few more: connections the server closed while idle
    assert tls.reuse_problem(2, 100, 2) == ""  # -c 100 -n 2 runs 2 users
    line = tls.reuse_problem(100, 4, 100)
    assert line.startswith("opened 100 connections for 100 requests from 4 users: the server did not keep them alive")
