"""`SweepSpec`: one frozen, typed description of a sweep. It *is* the sweep-file schema: each option is
declared once below, with its default, where it lives in the TOML file, its flag and its parser, and
everything else is derived from that declaration:

- `SweepSpec.from_toml(path)` reads a sweep file (or a session's `session.toml`, whose `[sweep]` table is
  the same format), `from_table(dict)` a parsed one;
- `SweepSpec.from_args(args, base)` applies `servescope run` flags as overrides on top of a file (or of the
  defaults), `add_flags(parser)` declares those flags;
- `SweepSpec.from_form(values, base)` reads the app's Compose form (strings, as typed) and returns every
  field's error at once;
- `spec.check(where)` holds every rule across options (concurrency or rates, variants need a launch
  command...): the three readers above end in it, so a bad combination reads the same from the CLI, a
  sweep file and the app (a `SweepConflict`, which names the fields, so the app shows it under one);
- `spec.to_table()` writes the sweep-file format back (`ctrl+s`, and the `[sweep]` table of a session, from
  which `servescope resume` continues with every setting the sweep started with).

Adding a sweep option is one `option(...)` field here plus the code that uses it. The file format,
with every section, is in docs/measuring.md (*Sweep files*).
Imported inside functions, to keep httpx off the app's start-up; core.launch, which needs neither, takes 40 ms:
core.launch, workloads.traces (benchmarks/import_cost.py; docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar, overload

from servescope.core.arrivals import Step
from servescope.core.errors import ServescopeError
from servescope.core.precision import Precision, dump_precision
from servescope.core.prices import ApiPrice, dump_price, parse_gpu_hour, parse_price
from servescope.core.secrets import is_redacted, redact_command
from servescope.core.textsafe import clean_text
from servescope.core.tls import TlsSettings, ca_cert_path
from servescope.core.workercount import DEFAULT_WORKERS, Workers
from servescope.engine import fields as f
from servescope.engine import measurefields as mf
from servescope.engine.measurefields import legacy_regime
from servescope.engine.spectoml import SectionLines, check_keys, table_workloads, workload_refs
from servescope.workloads.spec import Workload, parse_toml, resolve

DEFAULT_REQUESTS = 100  # measured requests per cell, when neither the sweep nor the workload says (and no duration)
PRECISION_CEILING = 2000  # with --precision and neither --requests nor --duration: each cell's ceiling

SWEEP_VERSION = 1
DEFAULT_URL = "sim://"

T = TypeVar("T")


class SweepConflict(ServescopeError):
    """A rule across several of a sweep's options is broken (SweepSpec.check). `rule` is its one line, the
    same for `servescope run`, a sweep file and the app; the message puts where before it ("flags: RULE",
    "sweep.toml: RULE"). `fields` are the SweepSpec fields it concerns, the one to change first first: the
    app shows the rule under that field."""

    def __init__(self, where: str, rule: str, fields: tuple[str, ...]) -> None:
        super().__init__(f"{where}: {rule}")
        self.rule = rule
        self.fields = fields


class FormField(NamedTuple):
    """Where the app's Compose screen holds an option: its input's id and the label people read beside it."""

    id: str
    label: str

    @property
    def said(self) -> str:
        """How the app's messages name it: "the URL field", "the `or launch` field"."""
        quoted = " " in self.label and self.label[:1].islower()
        return f"the `{self.label}` field" if quoted else f"the {self.label} field"


@dataclass(frozen=True)
class Option(Generic[T]):
    """How one field of a sweep of type T (or T | None) is read and written."""

    section: str  # "" (top level), "target", "load", "client", "slo", "tags", "server", "telemetry"
    key: str  # the TOML key; for "slo"/"tags" the whole table
    flags: tuple[str, ...]  # "--concurrency", "-c"; empty: no flag
    parse: Callable[[object, str], T | None]  # (TOML value, flag or form text; where) -> the value
    dump: Callable[[T], object] | None  # the value -> TOML (never given None: an unset option is not written)
    help: str
    metavar: str | None = None
    repeat: bool = False  # the flag may be given several times (a list)
    negate: bool = False  # a store_true flag that sets the field to False (--no-ignore-eos)
    form: FormField | None = None  # the Compose form's field that holds it (None: not on the form)
    switch: bool = False  # a store_true flag that sets the field to True (--stop-after-saturation, --reset-prefix-cache)


@overload
def option(default: T, section: str, key: str, flags: Sequence[str] = (), *, parse: Callable[[object, str], T],
           dump: Callable[[T], object] | None = None, help: str = "", metavar: str | None = None,
           repeat: bool = False, negate: bool = False, form: FormField | None = None, factory: None = None,
           switch: bool = False) -> T: ...


@overload
def option(default: T | None, section: str, key: str, flags: Sequence[str] = (), *,
           parse: Callable[[object, str], T | None], dump: Callable[[T], object] | None = None, help: str = "",
           metavar: str | None = None, repeat: bool = False, negate: bool = False, form: FormField | None = None,
           factory: None = None, switch: bool = False) -> T | None: ...


@overload
def option(default: None, section: str, key: str, flags: Sequence[str] = (), *, parse: Callable[[object, str], T],
           dump: Callable[[T], object] | None = None, help: str = "", metavar: str | None = None,
           repeat: bool = False, negate: bool = False, form: FormField | None = None,
           factory: Callable[[], T], switch: bool = False) -> T: ...


def option(default: T | None, section: str, key: str, flags: Sequence[str] = (), *,
           parse: Callable[[object, str], T | None], dump: Callable[[T], object] | None = None, help: str = "",
           metavar: str | None = None, repeat: bool = False, negate: bool = False, form: FormField | None = None,
           factory: Callable[[], T] | None = None, switch: bool = False) -> T | None:
    """A sweep field declared as an option: its default (or `factory` making it), and its Option."""
    meta = {"option": Option(section, key, tuple(flags), parse, dump, help, metavar, repeat, negate, form, switch)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


SEED_BOUND = 2**63  # a seed is stored in session.toml, whose integers are 64-bit


def seed_value(raw: object, where: str) -> int:
    """A seed: a whole number that TOML can store (-2^63 to 2^63 - 1). `--seed 1e23` and 10^23 are one line each."""
    if isinstance(raw, str) and not re.fullmatch(r"\s*[-+]?\d+\s*", raw):
        raise ServescopeError(f"{where}: {raw!r} is not a whole number; give a seed such as 42")
    n = f.any_int(raw.strip().lstrip("+") if isinstance(raw, str) else raw, where)
    if not -SEED_BOUND <= n < SEED_BOUND:
        raise ServescopeError(f"{where}: {n} is out of range; a seed is a whole number of at most 18 digits, e.g. 42")
    return n


def _workloads_default() -> tuple[Workload, ...]:
    return ()


@dataclass(frozen=True)
class SweepSpec:
    name: str = option("", "", "name", ["--name"], parse=f.text,
                       form=FormField("name", "name"), help="session name")
    url: str = option(DEFAULT_URL, "target", "url", ["--url"], parse=f.url, form=FormField("url", "URL"),
                      help="server base URL, e.g. http://127.0.0.1:8000, or sim://PROFILE for the built-in simulator "
                           "(default: $SERVESCOPE_URL, else sim://, the simulator's default profile)")
    api_key_env: str = option("OPENAI_API_KEY", "target", "api_key_env", ["--api-key-env"], parse=f.nonempty_text,
                              form=FormField("key-env", "API key var"),
                              metavar="NAME", help="environment variable holding the API key (default OPENAI_API_KEY)")
    model: str | None = option(None, "target", "model", ["--model"], parse=f.opt_text,
                               form=FormField("model", "model"),
                               help="served model name (default: the only one /v1/models lists)")
    tokenizer: str | None = option(None, "target", "tokenizer", ["--tokenizer"], parse=f.opt_path_or_name,
                                   help="local Hugging Face tokenizer path, for servers without /tokenize")
    engine: str = option("auto", "target", "engine", ["--engine"], parse=f.choice(f.ENGINES),
                         help="the server's engine: auto (recognised from its answers), vllm, llamacpp (llama.cpp's "
                              "llama-server) or openai (any other OpenAI-compatible server)")
    transport: str = option("raw", "target", "transport", ["--transport"], parse=f.choice(f.TRANSPORTS),
                            help="HTTP client for the load: raw (default: HTTP/1.1 on an asyncio protocol, the least "
                                 "CPU per streamed token), aiohttp (proxies, anything raw cannot read) or httpx")
    ca_cert: str | None = option(None, "target", "ca_cert", ["--ca-cert"], parse=ca_cert_path, metavar="PATH",
                                 help="an https server's CA certificate (PEM), for a private or self-signed CA "
                                      "(default: the system's trusted CAs)")
    tls_verify: bool | None = option(None, "target", "tls_verify", ["--insecure"], parse=f.boolean, negate=True,
                                     help="do not verify an https server's certificate (said on stderr, and recorded "
                                          "in the session as tls_verify = false)")
    workloads: tuple[Workload, ...] = field(default_factory=_workloads_default)
    concurrency: tuple[int, ...] | None = option(
        None, "load", "concurrency", ["--concurrency", "-c"], parse=f.int_list, dump=list,
            form=FormField("concurrency", "concurrency"),
        help="closed-loop users per cell, e.g. 1,4,8,16 (default: the workload's own, else 1,4,16)")
    rates: tuple[float, ...] | None = option(
        None, "load", "rates", ["--rate"], parse=f.float_list, dump=list, form=FormField("rates", "rates"),
        help="open-loop request rates per second, e.g. 2,5 (instead of --concurrency)")
    arrival: str = option("poisson", "load", "arrival", ["--arrival"], parse=f.choice(f.ARRIVALS),
                          help="open-loop arrivals: poisson (default), constant, or gamma (see --burstiness)")
    burstiness: float | None = option(
        None, "load", "burstiness", ["--burstiness"], parse=f.opt_burstiness, metavar="K",
        help="with --arrival gamma (needed: without it this is an error): the gamma shape of the gaps between "
             "requests, as `vllm bench serve --burstiness`; the mean rate stays --rate; 1 (default) is Poisson, "
             "below 1 burstier, above 1 more regular")
    ramp_s: float | None = option(
        None, "load", "ramp", ["--ramp"], parse=mf.opt_ramp, dump=mf.dump_ramp, metavar="auto|0|DURATION",
        help="ramp up within each cell: auto (default) starts a closed loop's users one by one over one request's "
             "E2E measured alone (the c=1 cell's, else one probe request), as tune starts them; 0 starts them "
             "together (in lockstep; a workload's own ramp still applies); a DURATION, e.g. 10s: an open loop's rate "
             "rises linearly from 0 to its target over it, a closed loop starts user u of N at u/N x ramp. Requests "
             "sent during the ramp are measured, outside the steady window")
    window: str = option("steady", "load", "window", ["--window"], parse=f.choice(mf.WINDOWS), metavar="steady|whole",
                         help="the requests a cell's figures are over: steady (default: sent while the load was at "
                              "its target, after the ramp and before the drain; the whole cell's figures are kept "
                              "beside them) or whole (every measured request over the cell's wall time; with "
                              "--ramp 0, the figures servescope gave before windows)")
    precision: Precision | None = option(
        None, "load", "precision", ["--precision"], parse=mf.opt_precision, dump=dump_precision,
        metavar="SHARE|FIGURE:SHARE,...",
        help="run each cell until the 95%% interval of its figures is within this share of them, e.g. 2%% (output "
             "tok/s and the median of each SLO's metric, TTFT's without SLOs) or output_tok_s:2%%,ttft_ms.p50:5%%; "
             "--requests/--duration stay the ceiling (default with --precision: 2,000 requests), and a cell that "
             "reaches it first is marked imprecise. The interval counts that requests share batches (batch means "
             "over spans of time: docs/metrics.md)")
    stop_after_saturation: bool = option(
        False, "load", "stop_after_saturation", ["--stop-after-saturation"], parse=f.boolean, switch=True,
        help="once a cell is saturated (its server queue stood or grew through its steady window and its throughput "
             "no longer rose with the load), run the next load and skip the ones above it (recorded as skipped, "
             "saying why)")
    probe_rate: float | None = option(
        None, "load", "probe_rate", ["--probe-rate"], parse=mf.opt_probe_rate, metavar="R",
        help="send small interference probes (64 tokens in, 16 out) at R per second (Poisson) during each cell, "
             "beside its load: their TTFT and E2E show what the load does to a newcomer (reported per cell, not in "
             "its figures)")
    pattern: tuple[Step, ...] | None = option(
        None, "load", "pattern", ["--pattern"], parse=f.opt_pattern, dump=f.dump_pattern,
        metavar='"1x for 20s, 4x for 5s, 1x"',
        help="open loop: multiply the rate step by step within each cell (a spike, a step up, 0x pauses); "
             "every step but the last lasts its time, the last holds until the cell ends")
    max_concurrency: int | None = option(None, "load", "max_concurrency", ["--max-concurrency"],
                                         parse=f.opt_count1, help="cap on in-flight requests in open-loop cells")
    requests: int | None = option(None, "load", "requests", ["--requests", "-n"], parse=f.opt_count1,
                                  form=FormField("requests", "requests"),
                                  help="measured requests per cell (default: the workload's own, else 100; none "
                                       "when only --duration is given)")
    duration_s: float | None = option(None, "load", "duration", ["--duration"], parse=f.opt_duration,
                                      form=FormField("duration", "duration"),
                                      dump=f.fmt_duration, help="stop issuing requests in a cell after this long, e.g. 60s")
    warmup: int = option(0, "load", "warmup", ["--warmup"], parse=f.count0, form=FormField("warmup", "warmup"),
                         help="requests sent first in each cell and not counted")
    repeat: int = option(1, "load", "repeat", ["--repeat"], parse=f.repeats, form=FormField("repeat", "repeat"),
                         help="run each cell K times, interleaved across the sweep (c=1,4,16, c=1,4,16, ...), so "
                              "slow drift hits every cell alike; each point's figures are then the median of its "
                              "repeats")
    quality_share: float = option(
        0.0, "load", "quality_share", ["--quality-share"], parse=f.share, metavar="SHARE",
            form=FormField("quality-share", "quality share"),
        help="mix quality-probe questions (arithmetic, key-value retrieval, JSON, and greedy prompts compared with "
             "their answers at idle) into each cell, about this share of its requests, e.g. 0.05: each cell then "
             "reports accuracy and divergence at its load (the probe requests are not in its speed figures)")
    timeout_s: float = option(600.0, "load", "timeout", ["--timeout"], parse=f.duration, dump=f.fmt_duration,
                              help="per-request timeout (default 600s)")
    ignore_eos: bool = option(True, "load", "ignore_eos", ["--no-ignore-eos"], parse=f.boolean, negate=True,
                              help="let the model stop early (output lengths then vary; default sends ignore_eos)")
    retry_after_s: float | None = option(
        None, "load", "retry_after", ["--retry-after"], parse=f.opt_duration, dump=f.fmt_duration,
        metavar="MAX_WAIT",
        help="send a request the server rate-limited (HTTP 429) again after its Retry-After, waiting at most MAX_WAIT "
             "each time (e.g. 30s; 1 s when it names no wait), up to 5 times; each request's waits are recorded "
             "(retry_wait_s) and its latency is the served attempt's. Default: no retry, a 429 is recorded as "
             "rate_limited (retrying would change the load's schedule)")
    seed: int = option(0, "load", "seed", ["--seed"], parse=seed_value,
                       help="seed of the whole sweep: the prompts, lengths and arrival times of every cell derive "
                            "from it (default 0); the same seed sends the same requests")
    workers: Workers = option(DEFAULT_WORKERS, "client", "workers", ["--workers"], parse=f.workers,
                                metavar="N|auto",
                                help="processes that send each cell's load, each with its own event loop and "
                                     "connections (default auto: 1 for small loads, more when one core cannot "
                                     "carry the load)")
    ray: str | None = option(None, "client", "ray", ["--ray"], parse=f.opt_text, metavar="ADDRESS|auto",
                             help="run the workers as Ray actors on the cluster at ADDRESS (auto: the one this "
                                  "machine belongs to); needs pip install 'servescope[ray]'")
    ray_nodes: tuple[str, ...] = option((), "client", "ray_nodes", ["--ray-nodes"], parse=f.names, dump=list,
                                        metavar="NODE,...",
                                        help="with --ray: the nodes (IP addresses or node IDs) to place workers on, "
                                             "one worker each (default: spread over the cluster)")
    slos: dict[str, float] = option(None, "slo", "", ["--slo"], parse=f.slos, dump=f.dump_slos, factory=dict,
                                    form=FormField("slos", "SLOs"),
                                    help="SLOs for goodput, e.g. ttft_ms=3000,tpot_ms=50")
    tags: dict[str, str] = option(None, "tags", "", ["--tag"], parse=f.tags, dump=dict, factory=dict, repeat=True,
                                  form=FormField("tags", "tags"),
                                  metavar="KEY=VALUE", help="label for the session, repeatable")
    launch: str | None = option(None, "server", "launch", ["--launch"], parse=f.opt_text,
                                form=FormField("launch", "or launch"),
                                metavar='"vllm serve MODEL ..."',
                                help="start this server command (no shell) for the run, wait for /health, stop it "
                                     "at the end")
    launch_timeout_s: float = option(900.0, "server", "launch_timeout", ["--launch-timeout"], parse=f.duration,
                                     dump=f.fmt_duration, help="how long a launched server may take to be healthy")
    recover_timeout_s: float = option(
        300.0, "server", "recover_timeout", ["--recover-timeout"], parse=f.duration, dump=f.fmt_duration,
        help="when the server stops answering mid-cell, wait this long for it to come back (relaunching it when "
             "servescope launched it), then re-run the lost cell (default 300s)")
    variants: tuple[str, ...] = option((), "server", "variants", ["--server-variant"], parse=f.variants,
                                       form=FormField("variants", "variants"),
                                       dump=f.dump_variants, repeat=True, metavar='"--ARG VALUE ..."',
                                       help="with --launch: run the whole sweep once per variant, relaunching the "
                                            "server with these extra arguments (repeatable)")
    lora_dir: str | None = option(
        None, "server", "lora_dir", ["--lora-dir"], parse=f.opt_path_or_name, metavar="DIR",
        help="with --launch and a workload naming LoRA adapters: the folder holding them (DIR/NAME); servescope adds "
             "--enable-lora and --lora-modules NAME=DIR/NAME for each adapter the command does not list")
    reset_prefix_cache: bool = option(
        False, "load", "reset_prefix_cache", ["--reset-prefix-cache"], parse=f.boolean, switch=True,
        help="empty the server's prefix cache before each cell (POST /reset_prefix_cache: vLLM serves it when started "
             "with VLLM_SERVER_DEV_MODE=1, the simulator always; said once when the server does not), so a cell's hit "
             "rate is its workload's own; recorded per cell as prefix_cache_reset")
    telemetry_interval_s: float | None = option(
        1.0, "telemetry", "interval", ["--telemetry-interval"], parse=f.interval, dump=f.dump_interval,
        help="how often /metrics and the GPUs are sampled during a cell (default 1s); `off` samples only at cell "
             "boundaries (each scrape costs a CPU-bound server a little: see Performance)")
    electricity_price: float | None = option(None, "telemetry", "electricity_price", ["--electricity-price"],
                                             parse=f.opt_price, metavar="USD_PER_KWH",
                                             help="electricity price, for cost per 1M output tokens (needs NVML)")
    price: ApiPrice | None = option(
        None, "target", "price", ["--price"], parse=parse_price, dump=dump_price, metavar="input=USD,output=USD",
        help="a hosted API's list price per 1M tokens, e.g. input=2.50,output=10: each cell's cost per 1M tokens "
             "from its measured input/output mix (docs/hosted.md)")
    gpu_hour: float | None = option(
        None, "target", "gpu_hour", ["--gpu-hour"], parse=parse_gpu_hour, metavar="USD",
        help="what the GPU box costs per hour (purchase amortised, or rental), e.g. 2.50: each cell's cost per 1M "
             "tokens from its measured throughput, plus energy with --electricity-price (docs/hosted.md)")

    # ---- derived ------------------------------------------------------------------------------------
    def check(self, where: str = "sweep") -> SweepSpec:
        """The rules across several options, all of them here: the flags (`from_args`), a sweep file
        (`from_table`) and the app's Compose form (`from_form`) all end here, so one bad combination gets one
        message from each. A broken rule raises SweepConflict ("WHERE: RULE", with the fields it concerns);
        returns self."""
        if self.concurrency and self.rates:
            raise SweepConflict(where, "give concurrency (closed loop) or rates (open loop), not both",
                                ("rates", "concurrency"))
        if self.burstiness is not None and self.arrival != "gamma":
            raise SweepConflict(where, f"burstiness shapes gamma arrivals, but arrival is {self.arrival!r}; add "
                                "arrival = \"gamma\" (--arrival gamma) or drop burstiness", ("burstiness", "arrival"))
        if self.pattern and not self.rates:
            raise SweepConflict(where, "a pattern multiplies an open loop's rate; give rates (--rate 2,5) or drop "
                                "the pattern", ("rates", "pattern"))
        if self.ray_nodes and not self.ray:
            raise SweepConflict(where, "ray nodes place Ray workers; add ray = \"auto\" (--ray auto, or the "
                                "cluster's ADDRESS) or drop the nodes", ("ray_nodes", "ray"))
        if self.price is not None and self.gpu_hour is not None:
            raise SweepConflict(where, "give price (a hosted API's, per 1M tokens) or gpu_hour (your GPU's), not "
                                "both: a session measures one of them; compare the two sessions", ("gpu_hour", "price"))
        if self.ca_cert is not None and self.tls_verify is False:
            raise SweepConflict(where, "give ca_cert (--ca-cert: verify the server with this CA) or tls_verify = false "
                                "(--insecure: verify nothing), not both", ("tls_verify", "ca_cert"))
        if (self.ca_cert is not None or self.tls_verify is False) and not self.launch:
            said = "ca_cert (--ca-cert)" if self.ca_cert is not None else "tls_verify = false (--insecure)"
            rule = tls_without_https(self.url, said)
            if rule is not None:
                raise SweepConflict(where, rule, ("ca_cert" if self.ca_cert is not None else "tls_verify", "url"))
        if self.lora_dir is not None and not self.launch:
            raise SweepConflict(where, "lora_dir names the adapters' folder for a server servescope launches; add a "
                                "launch command or drop lora_dir", ("lora_dir", "launch"))
        if self.variants and not self.launch:
            raise SweepConflict(where, "server variants need a launch command: servescope can only relaunch a "
                                "server it started", ("variants", "launch"))
        if self.launch and not is_redacted(self.launch) and not any(map(is_redacted, self.variants)):
            # a stored command whose secrets were redacted is read as it is; launching it is refused
            # (servescope.core.launchspec), and `resume --launch` / `run --launch` give it in full
            from servescope.core.launch import parse_launch, with_variant  # off the app's start-up: 40 ms

            try:
                spec = parse_launch(self.launch)
            except ServescopeError as e:
                raise SweepConflict(where, e.message, ("launch",)) from None
            for v in self.variants:  # each variant is read against the command it changes
                try:
                    with_variant(spec, v)
                except ServescopeError as e:
                    raise SweepConflict(where, e.message, ("variants", "launch")) from None
            adapters = [a for w in self.workloads if w.adapters is not None for a in w.adapters.adapters]
            try:  # the workloads' LoRA adapters must be served: listed in the command, or found in lora_dir
                spec.with_adapters(adapters, self.lora_dir)
            except ServescopeError as e:
                raise SweepConflict(where, e.message, ("lora_dir", "launch")) from None
        if not self.workloads:
            raise SweepConflict(where, "no workload; add workloads = [\"sharegpt\"] or a [[workload]] table",
                                ("workloads",))
        names = [w.name for w in self.workloads]
        if (twice := next((n for i, n in enumerate(names) if n in names[:i]), None)) is not None:
            raise SweepConflict(where, f"two workloads are named {twice!r}; give each its own name (cells, reports "
                                "and compare tell workloads apart by it), or run one workload with --repeat",
                                ("workloads",))
        if self.warmup:  # a warmup only readies the server: never more than the cell measures (a duration-only
            # cell's warmup ends with its duration: servescope.core.load.run_cell)
            for w in self.workloads:
                req = self.requests
                if req is None and self.duration_s is None:
                    req = PRECISION_CEILING if self.precision is not None else w.default_requests or DEFAULT_REQUESTS
                if w.kind != "trace" and req is not None and self.warmup > req:
                    raise SweepConflict(where, f"warmup {self.warmup:,} is more than the {req:,} measured requests of "
                                        f"a cell of {clean_text(w.name)!r}, and a warmup only readies the server; give "
                                        f"--warmup {req:,} or less (warmup = {req} in a sweep file), or more requests",
                                        ("warmup", "requests"))
        for w in self.workloads:  # datasets and traces read now: a bad one stops the run before anything starts
            w.check(where)
            if w.kind == "trace":
                from servescope.workloads.traces import workload_trace

                try:
                    workload_trace(w)
                except ServescopeError as e:
                    raise ServescopeError(f"{where}: {e.message}") from None
        return self

    def replace(self, **changes: object) -> SweepSpec:
        return _replaced(self, changes)

    def tls_settings(self) -> TlsSettings:
        """How an https target is checked (--ca-cert, --insecure: core/tls.py), the CA file read now."""
        return TlsSettings.load(self.ca_cert, self.tls_verify is not False)

    @property
    def target_text(self) -> str:
        """What the sweep runs against, for headers: the launch command (its secrets as ••••) or the URL."""
        return redact_command(self.launch) if self.launch else self.url

    # ---- TOML -----------------------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | Path) -> SweepSpec:
        """A sweep file, or a session's session.toml (its [sweep] table). One line per error, with file:line."""
        p = Path(path)
        if p.is_dir():
            if (p / "session.toml").is_file():
                p = p / "session.toml"
            else:
                raise ServescopeError(f"{p}: is a directory, not a sweep file; give FILE.toml (or a session "
                                      "directory, whose session.toml holds its sweep)")
        if not p.is_file():
            raise ServescopeError(f"{p}: no such sweep file; save one from the app (ctrl+s) or see docs/measuring.md#sweep-files")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ServescopeError(f"{p}: cannot read the sweep file ({e}); check the path") from None
        data = parse_toml(text, str(p))
        if "schema_version" in data and "cells" in data:  # a session
            sweep = data.get("sweep")
            if not isinstance(sweep, dict):
                raise ServescopeError(f"{p}: this session has no [sweep] table (written by servescope 0.1?); "
                                      "open it once with `servescope resume` or re-create the sweep in the app")
            return cls.from_table(legacy_regime(sweep), str(p), p.parent, SectionLines(text, prefix="sweep."))
        return cls.from_table(data, str(p), p.parent, SectionLines(text))

    @classmethod
    def from_table(cls, data: Mapping[str, object], where: str = "sweep", base_dir: Path | None = None,
                   lines: SectionLines | None = None) -> SweepSpec:
        """A parsed sweep table -> SweepSpec; unknown keys are errors with a suggestion."""
        loc = lines.locate if lines is not None else (lambda section, key: None)

        def at(section: str, key: str) -> str:
            line = loc(section, key)
            name = f"[{section}] {key}" if section and key else (f"[{section}]" if section else key)
            return f"{where}:{line}: {name}" if line else f"{where}: {name}"

        target = data.get("target")
        if isinstance(target, dict) and "api_key" in target:
            raise ServescopeError(f"{at('target', 'api_key')}: not allowed (keys never go in files); set "
                                  "api_key_env = \"NAME\" and export the key in that variable")
        check_keys(data, TOP_KEYS, "", at)
        ver = data.get("sweep_version", SWEEP_VERSION)
        if isinstance(ver, bool) or not isinstance(ver, int) or ver > SWEEP_VERSION:
            raise ServescopeError(f"{at('', 'sweep_version')}: {ver!r} is newer than this servescope understands; "
                                  "upgrade servescope")
        values: dict[str, object] = {}
        for fd, opt in _options():
            table = data if not opt.section else data.get(opt.section, {})
            if not isinstance(table, dict):
                raise ServescopeError(f"{at(opt.section, '')}: must be a table")
            if opt.section not in ("", "slo", "tags"):
                check_keys(table, SECTION_KEYS[opt.section], opt.section, at)
            if opt.section in ("slo", "tags"):
                if opt.section in data:
                    values[fd.name] = opt.parse(table, at(opt.section, ""))
            elif opt.key in table:
                values[fd.name] = opt.parse(table[opt.key], at(opt.section, opt.key))
        values["workloads"] = tuple(table_workloads(data, base_dir, at))
        server = data.get("server", {})
        if isinstance(server, dict) and server.get("launch") and isinstance(target, dict) and "url" in target:
            raise ServescopeError(f"{at('server', 'launch')}: give [target] url or [server] launch, not both: a "
                                  "launched server's URL comes from its command")
        return _replaced(cls(), values).check(where)

    def to_table(self, inline_workloads: bool = False) -> dict[str, object]:
        """The sweep-file format (TOML-ready: no None). `inline_workloads` writes file and inline workloads
        in full (a session's [sweep], so a later resume does not depend on files that may have changed);
        presets are always written by name."""
        out: dict[str, object] = {"sweep_version": SWEEP_VERSION}
        sections: dict[str, dict[str, object]] = {}
        for fd, opt in _options():
            v = getattr(self, fd.name)
            if (v is None and fd.default is None) or (opt.section in ("slo", "tags") and not v):
                continue
            if (opt.section == "server" and not self.launch and fd.name != "recover_timeout_s") \
                    or (fd.name == "url" and self.launch):
                continue
            if fd.name in ("variants", "ray_nodes", "reset_prefix_cache") and not v:
                continue
            dumped = opt.dump(v) if opt.dump else v
            if opt.section in ("slo", "tags"):
                out[opt.section] = dumped
            elif not opt.section:
                if dumped != "":
                    out[opt.key] = dumped
            else:
                sections.setdefault(opt.section, {})[opt.key] = dumped
        out.update(sections)
        names, inline = workload_refs(self.workloads, inline_workloads)
        if names:
            out["workloads"] = names
        if inline:
            out["workload"] = inline
        order = ["sweep_version", "name", "workloads", "target", "workload", "load", "client", "slo", "tags",
                 "server", "telemetry"]
        return {k: out[k] for k in order if k in out}

    def save(self, path: str | Path) -> Path:
        """Write a sweep file; the API key is never written, only the name of the variable that holds it."""
        import tomli_w

        p = Path(path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(f"# servescope sweep: run it with `servescope run --sweep {p.name}`\n"
                           + tomli_w.dumps(self.to_table()), encoding="utf-8")
            tmp.replace(p)
        except OSError as e:
            raise ServescopeError(f"cannot write {p}: {e.strerror}; choose another path") from None
        return p

    # ---- flags and forms ---------------------------------------------------------------------------
    @classmethod
    def from_args(cls, args: argparse.Namespace, base: SweepSpec | None = None) -> SweepSpec:
        """`servescope run` flags on top of `base` (a sweep file) or of the defaults; the first bad flag raises."""
        values: dict[str, object] = {}
        given: set[str] = set()
        for fd, opt in _options():
            raw = getattr(args, fd.name, None)
            if raw is None or raw is False or raw == []:
                continue
            given.add(fd.name)
            values[fd.name] = False if opt.negate else True if opt.switch else opt.parse(raw, opt.flags[0])
        for flag, v in (("--workload", getattr(args, "workloads", None)),
                        ("--api-key", getattr(args, "api_key", None))):
            if v is not None and not v.strip():  # an empty flag is a mistake, never "the default"
                raise ServescopeError(f"{flag}: empty; give a value (or leave the flag out for its default)")
        wl = getattr(args, "workloads", None)
        if wl:
            values["workloads"] = tuple(resolve(wl))
            given.add("workloads")
        if base is None:
            base = cls(url=os.environ.get("SERVESCOPE_URL") or DEFAULT_URL)
            if "workloads" not in given:
                values["workloads"] = tuple(resolve("sharegpt"))
        else:  # a flag replaces its counterpart in the file (both flags given: check() says which to drop)
            for fd, opt in _options():  # a table's flag (--tag, --slo) replaces only the keys it names
                old = getattr(base, fd.name)
                if fd.name in given and opt.section in ("slo", "tags") and isinstance(old, dict):
                    new = values[fd.name]
                    assert isinstance(new, dict)
                    values[fd.name] = {**old, **new}
            if "concurrency" in given and "rates" not in given:
                values["rates"] = None
            if "rates" in given and "concurrency" not in given:
                values["concurrency"] = None
            if "arrival" in given and "burstiness" not in given and values["arrival"] != "gamma":
                values["burstiness"] = None  # the file's gamma shape goes with the file's gamma arrivals
            if "launch" in given and "url" not in given:
                values["url"] = DEFAULT_URL
            if "url" in given and "launch" not in given:
                values["launch"], values["variants"] = None, ()
        if "launch" in given and "url" in given:
            raise ServescopeError("give --launch or --url, not both: a launched server's URL comes from its command")
        return _replaced(base, values).check("flags")  # the rules across options: check(), as for a file

    @classmethod
    def from_form(cls, form: Mapping[str, object], base: SweepSpec | None = None
                  ) -> tuple[SweepSpec | None, dict[str, str]]:
        """The Compose form (field name -> text as typed, or a list of Workloads for `workloads`) -> the spec,
        or None and every field's error ({field: message}). Once each field reads, check()'s rules across
        fields apply: a broken one is under the first field it concerns that the form holds (its message
        without the "sweep: " the CLI would add), else under "sweep", as is any other sweep-wide error."""
        values: dict[str, object] = {}
        errors: dict[str, str] = {}
        for fd, _opt in _options():
            if fd.name not in form:
                continue
            try:
                values[fd.name] = _opt.parse(form[fd.name], fd.name)
            except ServescopeError as e:
                errors[fd.name] = e.message.removeprefix(f"{fd.name}: ")
        if "workloads" in form:
            wls = form["workloads"]
            if not isinstance(wls, (list, tuple)) or not all(isinstance(w, Workload) for w in wls):
                raise TypeError("the form's workloads must be a list of Workloads")
            values["workloads"] = tuple(wls)
        if errors:
            return None, errors
        try:
            return _replaced(base or cls(), values).check("sweep"), {}
        except SweepConflict as e:  # under the first of its fields the form holds: the one to change
            return None, {next((n for n in e.fields if n in form), "sweep"): e.rule}
        except ServescopeError as e:
            return None, {"sweep": e.message.removeprefix("sweep: ")}


def tls_without_https(url: str, said: str) -> str | None:
    """The rule for --ca-cert and --insecure (`said`, as the caller names the one given): both say how an https
    server's certificate is checked, so with an http:// or sim:// URL, which has none, they are a mistake (a user
    who meant https would otherwise measure plain HTTP without a word). None when the URL is https://."""
    if url.strip().lower().startswith("https://"):
        return None
    return (f"{said} says how an https:// server's certificate is checked, but the URL {url} has no TLS; give its "
            "https:// URL, or leave it out")


def form_fields() -> dict[str, str]:
    """The app's Compose form: each of its option fields' input id -> the SweepSpec field it fills."""
    return {o.form.id: fd.name for fd, o in _options() if o.form is not None}


def form_labels() -> dict[str, str]:
    """The app's Compose form: each of its option fields' input id -> the label shown beside it."""
    return {o.form.id: o.form.label for _, o in _options() if o.form is not None}


def form_wording() -> dict[str, str]:
    """Each flag of an option the Compose form holds -> how the app names its field ("--url" -> "the URL
    field"), so that an engine message says, inside the app, which field to fix."""
    return {flag: o.form.said for _, o in _options() if o.form is not None for flag in o.flags if flag.startswith("--")}


def parse_field(name: str, raw: object, where: str | None = None) -> object:
    """One field's value from its text (a form field as typed); errors start with `where` (default: the name)."""
    for fd, opt in _options():
        if fd.name == name:
            return opt.parse(raw, where or name)
    raise KeyError(name)


def _replaced(spec: SweepSpec, values: Mapping[str, object]) -> SweepSpec:
    """`spec` with `values`: each under its field's name and of that field's type (what the field's own
    Option parsed, or what a caller names). A type checker cannot match a value to its field by name:
    the field's parser is the check."""
    return functools.partial(dataclasses.replace, spec)(**values)


def _options() -> list[tuple[dataclasses.Field[object], Option[object]]]:
    return [(fd, fd.metadata["option"]) for fd in dataclasses.fields(SweepSpec) if "option" in fd.metadata]


NEGATIVE_VALUE = re.compile(r"^-\.?\d")  # "-5s", "-1", "-.5": no flag looks so


def values_may_start_with_minus(p: argparse.ArgumentParser) -> None:
    """Let `p` read an argument such as "-5s" as a flag's value, as it reads "-5": argparse took "--ramp -5s"
    for a flag with no value ("expected one argument"), and never said that a ramp must be above 0. No
    servescope flag starts with a minus and a digit."""
    p._negative_number_matcher = NEGATIVE_VALUE


def add_flags(p: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """Declare the spec's flags (all, or the fields named in `only`). Every flag defaults to None, so
    `from_args` can tell a flag that was given from one that was not. A value may start with a minus
    (`--ramp -5s`): its parser then says what is wrong with it."""
    values_may_start_with_minus(p)
    for fd, opt in _options():
        if not opt.flags or (only is not None and fd.name not in only):
            continue
        if opt.negate or opt.switch:
            p.add_argument(*opt.flags, dest=fd.name, action="store_true", default=None, help=opt.help)
        elif opt.repeat:
            p.add_argument(*opt.flags, dest=fd.name, action="append", default=None, metavar=opt.metavar,
                           help=opt.help)
        else:
            p.add_argument(*opt.flags, dest=fd.name, default=None, metavar=opt.metavar, help=opt.help)


def add_workload_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", dest="workloads", default=None,
                   help="preset name(s) or TOML file(s), comma-separated (default sharegpt; see `servescope workloads`)")


# ---- keys, lines and workloads ------------------------------------------------------------------------
SECTION_KEYS: dict[str, set[str]] = {}
for _fd in dataclasses.fields(SweepSpec):
    if "option" in _fd.metadata:
        _o = _fd.metadata["option"]
        if _o.section not in ("", "slo", "tags"):
            SECTION_KEYS.setdefault(_o.section, set()).add(_o.key)
TOP_KEYS = {"sweep_version", "workloads", "workload", "slo", "tags", *SECTION_KEYS} | {
    o.key for _, o in _options() if not o.section}


@dataclass(frozen=True)
class RunContext:
    """What a run needs besides its spec, never stored with it: the real base URL (a started simulator's,
    '' when the engine launches the server), the label shown and stored instead (`sim://tiny`), the API key,
    where the session goes, and the session to resume."""

    url: str = ""
    target_label: str | None = None
    api_key: str | None = None
    save_dir: Path | None = None
    sessions_dir: Path | None = None
    resume: Path | None = None
    health_interval_s: float = 2.0
