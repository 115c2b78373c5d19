"""Command line of the simulator: `python -m servescope.sim --profile NAME --port PORT ...`.

The server (aiohttp) is imported only by the commands that serve: listing profiles starts at once."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import math
import os
import signal
import socket
import ssl
import sys

from servescope.sim.hosted import DEFAULT_JITTER_MS, DEFAULT_LATENCY_MS, DEFAULT_TPM, Hosted
from servescope.sim.lora import LoraModulesError, parse_lora_modules
from servescope.sim.profile import DEFAULT_PROFILE, ProfileError, describe, list_profiles, load_profile
from servescope.sim.specdecode import SpecConfigError, parse_spec_config

LISTENING = "servescope-sim listening on "


def _rate(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return v


def _factor(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1000.0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be between 0 and 1000, got {text}")
    return v


def check_args(args: argparse.Namespace) -> str | None:
    """The first flag whose value cannot run, as one line naming it and what to give; None when all can. A
    port is 0..65535 (0: any free port; 99999 listened on 34463, -1 failed with exit 1); every engine limit is
    at least 1 (--max-num-seqs 0 took requests that then waited forever); a fault is 0 (off) or more."""
    if not 0 <= args.port <= 65535:
        return f"--port {args.port}: a port is 0 to 65535 (0 picks a free port)"
    for flag, v in (("--kv-cache-tokens", args.kv_cache_tokens), ("--max-num-seqs", args.max_num_seqs),
                    ("--max-num-batched-tokens", args.max_num_batched_tokens), ("--max-model-len", args.max_model_len)):
        if v is not None and v < 1:
            return f"{flag} {v}: must be 1 or more (leave it out for the profile's own)"
    if args.exit_after_requests < 0:
        return f"--exit-after-requests {args.exit_after_requests}: must be 0 (never) or more"
    if not 0 <= args.exit_at < math.inf:
        return f"--exit-at {args.exit_at:g}: must be 0 (never) or a number of seconds above 0"
    if args.served_model_name is not None and not args.served_model_name.strip():
        return "--served-model-name: empty; give a name (or leave it out for the profile's model)"
    if args.exit_with_parent < 0:
        return f"--exit-with-parent {args.exit_with_parent}: not a process id"
    if args.tpm is not None and args.tpm < 0:
        return f"--tpm {args.tpm}: must be 0 (no limit) or more tokens per minute"
    for flag, ms in (("--net-latency-ms", args.net_latency_ms), ("--net-jitter-ms", args.net_jitter_ms)):
        if ms is not None and not 0 <= ms < 600_000:  # NaN too
            return f"{flag} {ms:g}: must be 0 or more milliseconds (and under 10 minutes)"
    for flag, v in (("--max-loras", args.max_loras), ("--max-lora-rank", args.max_lora_rank)):
        if v is not None and v < 1:
            return f"{flag} {v}: must be 1 or more"
    if args.lora_modules and not args.enable_lora:
        return "--lora-modules needs --enable-lora (as vLLM does)"
    if args.spec_acceptance is not None and args.speculative_config is None:
        return "--spec-acceptance needs --speculative-config (it is the acceptance of drafted tokens)"
    if args.api_key is not None and not args.api_key.strip():
        return "--api-key: empty; give the key clients must send (or leave it out to accept any)"
    if (args.tls_cert is None) != (args.tls_key is None):
        return "--tls-cert and --tls-key go together: give both (the certificate chain and its private key)"
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None and not os.path.isfile(path):
            return f"{flag} {path}: no such file; give a PEM file"
    return None


def hosted_config(args: argparse.Namespace) -> Hosted:
    """The hosted-mode settings of the flags: --hosted's defaults (a tokens-per-minute limit, network latency and
    jitter) unless a flag says otherwise; without --hosted, none unless asked."""
    h = args.hosted

    def given(v: float | None, hosted_default: float) -> float:
        return v if v is not None else (hosted_default if h else 0.0)

    return Hosted(hosted=h, tpm=int(given(args.tpm, DEFAULT_TPM)),
                  latency_ms=given(args.net_latency_ms, DEFAULT_LATENCY_MS),
                  jitter_ms=given(args.net_jitter_ms, DEFAULT_JITTER_MS),
                  api_key=args.api_key, reject_vllm_fields=args.reject_vllm_fields, seed=args.seed,
                  close_connections=args.close_connections)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """The server's TLS context from a PEM certificate chain and its key; a bad pair raises ValueError (one line)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"--tls-cert {cert} --tls-key {key}: cannot load the certificate and key ({e}); give a "
                         "PEM certificate chain and its private key") from None
    return ctx


def build_parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The simulator's flags. `servescope sim` passes servescope's own parser class, whose errors are one line naming
    the closest flag (servescope/cli/args.py); the simulator imports nothing of servescope's, so `python -m
    servescope.sim` alone keeps argparse's."""
    p = parser_class(
        prog="servescope sim",
        description="Simulate a vLLM 0.32 server serving a model on a GPU, in real time (OpenAI-compatible API).",
        epilog="docs: docs/simulator.md; every flag: docs/reference/cli.md#sim",
    )
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"profile name or path to a .toml (default {DEFAULT_PROFILE})")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--list", action="store_true", help="list the shipped profiles and exit")
    g = p.add_argument_group("engine overrides")
    g.add_argument("--kv-cache-tokens", type=int, help="KV cache size in tokens (as vLLM's --num-gpu-blocks-override x 16)")
    g.add_argument("--max-num-seqs", type=int)
    g.add_argument("--max-num-batched-tokens", type=int)
    g.add_argument("--max-model-len", type=int)
    g.add_argument("--served-model-name")
    g.add_argument("--no-enable-prefix-caching", action="store_true")
    sd = p.add_argument_group("speculative decoding and LoRA adapters (vLLM's own flags)")
    sd.add_argument("--speculative-config", metavar="JSON", default=None,
                    help="speculative decoding, as vLLM takes it: '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}' "
                         "(methods: ngram, eagle, eagle3, medusa, mlp_speculator, mtp, draft_model, suffix); a "
                         "drafted token is accepted with the request's vllm_xargs.spec_acceptance, else "
                         "--spec-acceptance, else the method's typical rate")
    sd.add_argument("--spec-acceptance", type=_rate, default=None, metavar="P",
                    help="with --speculative-config: a drafted token's acceptance when the request does not say "
                         "(default: 0.5 for ngram and suffix, 0.7 for a model-based method)")
    sd.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (--lora-modules)")
    sd.add_argument("--lora-modules", nargs="+", action="extend", default=None, metavar="NAME=PATH",
                    help="adapters requests name as their model, as vLLM takes them (PATH is not read)")
    sd.add_argument("--max-loras", type=int, default=None, metavar="N",
                    help="adapters one batch may hold, each in a GPU slot; another is swapped in (default 1)")
    sd.add_argument("--max-lora-rank", type=int, default=None, metavar="R",
                    help="the adapters' rank: their size and cost (default 16)")
    f = p.add_argument_group("faults")
    f.add_argument("--exit-after-requests", type=int, default=0, metavar="N", help="exit abruptly after N completed requests")
    f.add_argument("--exit-at", type=float, default=0.0, metavar="SECONDS", help="exit abruptly SECONDS after start")
    f.add_argument("--error-rate", type=_rate, default=0.0, metavar="P", help="answer this fraction of requests with HTTP 500")
    f.add_argument("--cut-stream-rate", type=_rate, default=0.0, metavar="P", help="cut this fraction of streams mid-way")
    f.add_argument("--slow-decode", type=_rate, default=0.0, metavar="F",
                   help="decode steps take (1 + F) times as long (0.08: 8%% slower), a regression to catch")
    f.add_argument("--usage-factor", type=_factor, default=1.0, metavar="F",
                   help="a streamed answer's final usage says F times the tokens it streamed (2: a server whose "
                        "usage.completion_tokens doubles; default 1, the truth)")
    f.add_argument("--seed", type=int, default=0, help="seed of the fault draws (and of the network jitter)")
    h = p.add_argument_group("hosted API (--hosted), API key and TLS")
    h.add_argument("--hosted", action="store_true",
                   help="act as a hosted API: no /tokenize, /metrics, /health or /version (404), a tokens-per-minute "
                        f"limit (default {DEFAULT_TPM:,}) answered 429 with Retry-After, added network latency "
                        f"(default {DEFAULT_LATENCY_MS:g} ms + up to {DEFAULT_JITTER_MS:g} ms of jitter)")
    h.add_argument("--tpm", type=int, default=None, metavar="N",
                   help="tokens per minute (prompt + max_tokens of each request) before requests get 429; 0: no "
                        f"limit (default: {DEFAULT_TPM:,} with --hosted, else 0)")
    h.add_argument("--net-latency-ms", type=float, default=None, metavar="MS",
                   help=f"added network latency per request (default {DEFAULT_LATENCY_MS:g} with --hosted, else 0)")
    h.add_argument("--net-jitter-ms", type=float, default=None, metavar="MS",
                   help="up to this much more latency, drawn per request (default "
                        f"{DEFAULT_JITTER_MS:g} with --hosted, else 0)")
    h.add_argument("--reject-vllm-fields", action="store_true",
                   help="answer 400 to vLLM's own request fields (ignore_eos, min_tokens, ...), as OpenAI's API does")
    h.add_argument("--close-connections", action="store_true",
                   help="close every connection after its response (a server or proxy without keep-alive)")
    h.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (default: any request is served)")
    h.add_argument("--tls-cert", default=None, metavar="PATH", help="serve HTTPS with this PEM certificate (chain)")
    h.add_argument("--tls-key", default=None, metavar="PATH", help="... and this PEM private key")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--exit-with-parent", type=int, default=0, metavar="PID", help=argparse.SUPPRESS)
    return p


def exit_with_parent(pid: int, poll_s: float = 0.25) -> None:
    """Stop this simulator when process `pid`, its parent, is gone, however it ended (kill -9 included): a
    daemon thread polls the parent pid (a dead parent's children are re-parented), then SIGTERMs this process
    (a clean stop) and exits hard if that did not end it within 5 s."""
    import os
    import threading
    import time

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        os._exit(0)

    threading.Thread(target=watch, name="servescope-sim-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> int:
    args = build_parser(parser_class).parse_args(argv)
    bad = check_args(args)
    if bad is not None:
        print(f"servescope sim: error: {bad}", file=sys.stderr)
        return 2
    if args.exit_with_parent:
        exit_with_parent(args.exit_with_parent)
    if args.list:
        for name in list_profiles():
            print(f"{name:48s} {describe(name)}")
        return 0
    try:
        profile = load_profile(args.profile)
    except ProfileError as e:
        print(f"servescope sim: error: {e}", file=sys.stderr)
        return 2
    try:
        spec = parse_spec_config(args.speculative_config) if args.speculative_config is not None else None
        adapters = parse_lora_modules(args.lora_modules or [])
    except (SpecConfigError, LoraModulesError) as e:
        print(f"servescope sim: error: {e}", file=sys.stderr)
        return 2
    engine_kw = {
        "speculative_method": spec.method if spec is not None else None,
        "num_speculative_tokens": spec.num_speculative_tokens if spec is not None else None,
        "spec_acceptance": args.spec_acceptance,
        "enable_lora": True if args.enable_lora else None,
        "max_loras": args.max_loras,
        "max_lora_rank": args.max_lora_rank,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_model_len": args.max_model_len,
        "served_name": args.served_model_name,
        "enable_prefix_caching": False if args.no_enable_prefix_caching else None,
    }
    if args.kv_cache_tokens is not None:
        engine_kw["kv_cache_tokens"] = args.kv_cache_tokens
    if args.slow_decode:
        engine_kw["decode_slowdown"] = 1.0 + args.slow_decode
    profile = profile.with_overrides(**engine_kw)
    logging.basicConfig(
        level=getattr(logging, args.log_level), stream=sys.stderr,
        format="%(levelname)s %(asctime)s [servescope-sim] %(message)s", datefmt="%m-%d %H:%M:%S",
    )
    from servescope.sim.server import Faults

    faults = Faults(args.exit_after_requests, args.exit_at, args.error_rate, args.cut_stream_rate, args.seed,
                    args.usage_factor)
    try:
        tls = tls_context(args.tls_cert, args.tls_key) if args.tls_cert and args.tls_key else None
    except ValueError as e:
        print(f"servescope sim: error: {e}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_serve(profile, faults, args.host, args.port, hosted_config(args), tls, adapters))
    except KeyboardInterrupt:
        pass
    except OSError as e:  # the address the flags name: bad input, exit 2 as every other flag's
        print(f"servescope sim: error: {listen_error(args.host, args.port, e)}", file=sys.stderr)
        return 2
    return 0


def listen_error(host: str, port: int, e: OSError) -> str:
    """Why the simulator cannot listen on --host/--port, as one line saying which flag to change."""
    why = e.strerror if isinstance(e, socket.gaierror) or not e.errno else os.strerror(e.errno)
    why = " ".join(str(why or e).split())
    if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: not an address of this machine ({why}); give e.g. 127.0.0.1 or 0.0.0.0"
    if e.errno == errno.EADDRINUSE:
        return f"--port {port}: already in use on {host} ({why}); give another port (0 picks a free one)"
    return f"cannot listen on {host}:{port} ({why}); check --host and --port"


async def _serve(profile: object, faults: object, host: str, port: int, hosted: Hosted | None = None,
                 tls: ssl.SSLContext | None = None, adapters: dict[str, str] | None = None) -> None:
    from aiohttp import web

    from servescope.sim.server import SimServer, startup_log_lines

    server = SimServer(profile, faults, hosted, adapters)  # type: ignore[arg-type]
    log = logging.getLogger("servescope.sim")
    runner = web.AppRunner(server.make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, backlog=1024, ssl_context=tls)
    await site.start()
    bound = port
    srv = getattr(site, "_server", None)
    for sock in getattr(srv, "sockets", None) or []:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            bound = sock.getsockname()[1]
            break
    shown = f"[{host}]" if ":" in host else host
    sys.stdout.write(f"{LISTENING}{'https' if tls is not None else 'http'}://{shown}:{bound}\n")
    sys.stdout.flush()
    for line in startup_log_lines(server):
        log.info(line)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover (Windows)
            pass
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
