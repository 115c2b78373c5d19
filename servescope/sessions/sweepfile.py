"""A whole sweep as one TOML file: target, workloads, load, SLOs and tags. The TUI saves and loads it;
`servescope run --sweep FILE.toml` runs the same file headless.

    workloads = ["sharegpt", "my-workloads/rag.toml"]   # presets or TOML paths (relative to this file)

    [target]
    url = "http://127.0.0.1:8000"      # or "sim://tiny"
    api_key_env = "OPENAI_API_KEY"     # the variable's NAME: the key itself is never written
    model = "Qwen/Qwen3-8B"            # optional

    [[workload]]                        # and/or inline workloads (the workload TOML schema)
    name = "rag-4k"
    input_tokens = 4096
    output_tokens = 256

    [load]
    concurrency = [1, 4, 16]           # or rates = [0.5, 2] (requests per second), arrival = "poisson"
    requests = 100                      # and/or duration = "60s"
    warmup = 4
    timeout = "600s"

    [slo]
    ttft_ms = 3000
    tpot_ms = 50

    [tags]
    quant = "FP8"

    [server]                            # optional: servescope starts (and stops) the server itself
    launch = "vllm serve Qwen/Qwen3-8B --port 8000"   # replaces [target] url
    launch_timeout = "900s"
    recover_timeout = "300s"
    [[server.variants]]                 # optional: the whole sweep once per variant, server relaunched
    args = "--gpu-memory-utilization 0.70"
    [[server.variants]]
    args = "--gpu-memory-utilization 0.85"

`load_sweep()` returns the values in the forms the `servescope run` flags take (argparse `dest` names,
strings where the flag is a string), plus `workloads`: the resolved Workload objects, inline ones included.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from servescope.core.errors import ServescopeError
from servescope.core.metrics import SLO_KEYS
from servescope.workloads.spec import Workload, parse_toml, resolve

SWEEP_VERSION = 1
LOAD_KEYS = {"concurrency", "rates", "arrival", "max_concurrency", "requests", "duration", "warmup", "timeout"}
TOP_KEYS = {"sweep_version", "name", "target", "workloads", "workload", "load", "slo", "tags", "server"}
SERVER_KEYS = {"launch", "launch_timeout", "recover_timeout", "variants"}


def parse_duration(text: str, where: str = "duration") -> float:
    """'60s', '5m', '1.5h', '250ms' or '90' (seconds) -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text or "")
    if not m:
        raise ServescopeError(f"{where}: bad duration {text!r}; use e.g. 60s, 5m or 90")
    v = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if v <= 0:
        raise ServescopeError(f"{where}: the duration must be above 0")
    return v


def parse_int_list(text: str, where: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16]; anything else says which part is wrong."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise ServescopeError(f"{where}: bad value {part!r}; give positive integers like 1,4,8")
        out.append(int(part))
    if not out:
        raise ServescopeError(f"{where}: empty; give positive integers like 1,4,8")
    return out


def parse_float_list(text: str, where: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = float(part)
        except ValueError:
            raise ServescopeError(f"{where}: bad value {part!r}; give request rates like 0.5,2,5") from None
        if v <= 0 or math.isnan(v) or math.isinf(v):
            raise ServescopeError(f"{where}: bad value {part!r}; rates must be above 0")
        out.append(v)
    if not out:
        raise ServescopeError(f"{where}: empty; give request rates like 0.5,2,5")
    return out


def _fmt_num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _duration_str(v: Any, where: str) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        raise ServescopeError(f"{where}: give a duration like \"60s\" or a number of seconds")
    if isinstance(v, (int, float)):
        if v <= 0 or math.isnan(v):
            raise ServescopeError(f"{where}: must be above 0")
        return f"{_fmt_num(float(v))}s"
    if isinstance(v, str):
        parse_duration(v, where)  # raises with an actionable message
        return v.strip()
    raise ServescopeError(f"{where}: give a duration like \"60s\" or a number of seconds")


def _int_list(v: Any, where: str) -> list[int]:
    if isinstance(v, str):
        return parse_int_list(v, where)
    if not isinstance(v, list) or not v:
        raise ServescopeError(f"{where}: give a list of positive integers like [1, 4, 16]")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ServescopeError(f"{where}: {x!r} is not a positive integer; give a list like [1, 4, 16]")
        out.append(x)
    return out


def _float_list(v: Any, where: str) -> list[float]:
    if isinstance(v, str):
        return parse_float_list(v, where)
    if not isinstance(v, list) or not v:
        raise ServescopeError(f"{where}: give a list of request rates like [0.5, 2, 5]")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0:
            raise ServescopeError(f"{where}: {x!r} is not a rate above 0; give a list like [0.5, 2, 5]")
        out.append(float(x))
    return out


def _opt_int(v: Any, where: str, lowest: int) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
        raise ServescopeError(f"{where}: must be an integer of at least {lowest}")
    return v


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    t = data.get(key, {})
    if not isinstance(t, dict):
        raise ServescopeError(f"{where}: [{key}] must be a table")
    return t


def parse_sweep(data: dict[str, Any], where: str, base_dir: Path | None = None) -> dict[str, Any]:
    """Validate a parsed sweep table; see the module docstring for the result."""
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise ServescopeError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected {', '.join(sorted(TOP_KEYS))}")
    ver = data.get("sweep_version", SWEEP_VERSION)
    if not isinstance(ver, int) or ver > SWEEP_VERSION:
        raise ServescopeError(f"{where}: sweep_version {ver!r} is newer than this servescope understands; upgrade")
    target = _table(data, "target", where)
    load = _table(data, "load", where)
    slo = _table(data, "slo", where)
    tags = _table(data, "tags", where)
    bad = set(load) - LOAD_KEYS
    if bad:
        raise ServescopeError(f"{where}: unknown [load] key(s) {', '.join(sorted(bad))}; expected {', '.join(sorted(LOAD_KEYS))}")

    url = target.get("url", "sim://")
    if not isinstance(url, str) or not url.strip():
        raise ServescopeError(f"{where}: [target] url must be a string like \"http://127.0.0.1:8000\" or \"sim://tiny\"")
    key_env = target.get("api_key_env", "OPENAI_API_KEY")
    if "api_key" in target:
        raise ServescopeError(f"{where}: [target] api_key is not allowed (keys never go in files); "
                              "set api_key_env = \"NAME\" and export the key in that variable")
    if not isinstance(key_env, str) or not key_env.strip():
        raise ServescopeError(f"{where}: [target] api_key_env must be an environment variable name")
    model = target.get("model")
    if model is not None and not isinstance(model, str):
        raise ServescopeError(f"{where}: [target] model must be a string")

    # workloads: names/paths, and inline [[workload]] tables
    names = data.get("workloads", [])
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ServescopeError(f"{where}: workloads must be a list of preset names or TOML paths")
    resolved_names = []
    for n in names:
        if (n.endswith(".toml") or "/" in n) and base_dir is not None and not Path(n).is_absolute():
            resolved_names.append(str((base_dir / n).resolve()))
        else:
            resolved_names.append(n)
    workloads: list[Workload] = resolve(resolved_names) if resolved_names else []
    inline = data.get("workload", [])
    if isinstance(inline, dict):
        inline = [inline]
    if not isinstance(inline, list):
        raise ServescopeError(f"{where}: [[workload]] must be tables")
    for i, item in enumerate(inline):
        if not isinstance(item, dict):
            raise ServescopeError(f"{where}: [[workload]] {i + 1} must be a table")
        workloads.append(Workload.from_dict({**item, "source": "inline"}, f"{where}: [[workload]] {i + 1}"))
    if not workloads:
        raise ServescopeError(f"{where}: no workload; add workloads = [\"sharegpt\"] or a [[workload]] table")

    conc = _int_list(load["concurrency"], f"{where}: [load] concurrency") if "concurrency" in load else None
    rates = _float_list(load["rates"], f"{where}: [load] rates") if "rates" in load else None
    if conc and rates:
        raise ServescopeError(f"{where}: [load] give concurrency (closed loop) or rates (open loop), not both")
    arrival = load.get("arrival", "poisson")
    if arrival not in ("constant", "poisson"):
        raise ServescopeError(f"{where}: [load] arrival must be \"constant\" or \"poisson\"")
    requests = _opt_int(load.get("requests"), f"{where}: [load] requests", 1)
    warmup = _opt_int(load.get("warmup", 0), f"{where}: [load] warmup", 0) or 0
    maxc = _opt_int(load.get("max_concurrency"), f"{where}: [load] max_concurrency", 1)
    duration = _duration_str(load.get("duration"), f"{where}: [load] duration")
    timeout = _duration_str(load.get("timeout", "600s"), f"{where}: [load] timeout") or "600s"

    slos: dict[str, float] = {}
    for k, v in slo.items():
        if k not in SLO_KEYS:
            raise ServescopeError(f"{where}: [slo] unknown key {k!r}; use one of {', '.join(sorted(SLO_KEYS))}")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ServescopeError(f"{where}: [slo] {k} must be a number")
        slos[k] = float(v)
    tag_out = {str(k): str(v) for k, v in tags.items()}
    server = parse_server(_table(data, "server", where), where, url_given="url" in target)
    if server["launch"]:
        url = ""  # the launched server's URL comes from its command
    name = data.get("name", "")
    if not isinstance(name, str):
        raise ServescopeError(f"{where}: name must be a string")

    return {
        "url": url.strip(),
        "api_key_env": key_env.strip(),
        "model": model,
        "workload": ",".join(names + [w.name for w in workloads if w.source == "inline"]),
        "workloads": workloads,
        "concurrency": ",".join(map(str, conc)) if conc else None,
        "rate": ",".join(_fmt_num(r) for r in rates) if rates else None,
        "arrival": arrival,
        "max_concurrency": maxc,
        "requests": requests,
        "duration": duration,
        "warmup": warmup,
        "slo": ",".join(f"{k}={_fmt_num(v)}" for k, v in slos.items()) or None,
        "slos": slos,
        "tag": [f"{k}={v}" for k, v in tag_out.items()],
        "tags": tag_out,
        "name": name,
        "timeout": timeout,
        **server,
    }


def parse_server(server: dict[str, Any], where: str, url_given: bool = False) -> dict[str, Any]:
    """The [server] table -> launch, launch_timeout, recover_timeout, server_variant (a list of argument
    strings). The launch command and each variant are checked the way `servescope run --launch` does."""
    from servescope.core.launch import parse_launch, with_variant

    bad = set(server) - SERVER_KEYS
    if bad:
        raise ServescopeError(f"{where}: unknown [server] key(s) {', '.join(sorted(bad))}; "
                              f"expected {', '.join(sorted(SERVER_KEYS))}")
    launch = server.get("launch")
    if launch is not None and (not isinstance(launch, str) or not launch.strip()):
        raise ServescopeError(f"{where}: [server] launch must be a command like \"vllm serve MODEL --port 8000\"")
    raw = server.get("variants", [])
    if not isinstance(raw, list):
        raise ServescopeError(f"{where}: [server] variants must be [[server.variants]] tables with args = \"...\"")
    variants: list[str] = []
    for i, v in enumerate(raw):
        if isinstance(v, dict):
            extra = set(v) - {"args"}
            if extra or not isinstance(v.get("args"), str):
                raise ServescopeError(f"{where}: [[server.variants]] {i + 1}: give only args = \"--ARG VALUE ...\"")
            v = v["args"]
        if not isinstance(v, str):
            raise ServescopeError(f"{where}: [[server.variants]] {i + 1}: give args = \"--ARG VALUE ...\"")
        variants.append(v.strip())
    if variants and not launch:
        raise ServescopeError(f"{where}: [[server.variants]] needs [server] launch: servescope can only relaunch "
                              "a server it started")
    if launch and url_given:
        raise ServescopeError(f"{where}: give [target] url or [server] launch, not both: a launched server's URL "
                              "comes from its command")
    if launch:
        try:
            spec = parse_launch(launch)
            for v in variants:
                with_variant(spec, v)
        except ServescopeError as e:
            raise ServescopeError(f"{where}: [server] {e.message}") from None
    return {
        "launch": launch.strip() if launch else None,
        "launch_timeout": _duration_str(server.get("launch_timeout", "900s"), f"{where}: [server] launch_timeout"),
        "recover_timeout": _duration_str(server.get("recover_timeout", "300s"), f"{where}: [server] recover_timeout"),
        "server_variant": variants,
    }


def load_sweep(path: str | Path) -> dict[str, Any]:
    """Read and check a sweep TOML file. Errors are ServescopeError with file:line:col where TOML is bad."""
    p = Path(path)
    if not p.is_file():
        raise ServescopeError(f"{p}: no such sweep file; save one from the app (ctrl+s) or see the README")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ServescopeError(f"{p}: cannot read the sweep file ({e}); check the path") from None
    return parse_sweep(parse_toml(text, str(p)), str(p), p.parent)


def sweep_table(
    *,
    url: str,
    workloads: Sequence[Workload | str],
    api_key_env: str = "OPENAI_API_KEY",
    model: str | None = None,
    concurrency: list[int] | None = None,
    rates: list[float] | None = None,
    arrival: str = "poisson",
    max_concurrency: int | None = None,
    requests: int | None = None,
    duration: str | float | None = None,
    warmup: int = 0,
    timeout: str | None = None,
    slos: dict[str, float] | None = None,
    tags: dict[str, str] | None = None,
    name: str = "",
    launch: str | None = None,
    variants: Sequence[str] = (),
    launch_timeout: str | None = None,
    recover_timeout: str | None = None,
) -> dict[str, Any]:
    """The TOML table for a sweep. Presets and file workloads are written by name/path, others inline."""
    target: dict[str, Any] = {"api_key_env": api_key_env} if launch else {"url": url, "api_key_env": api_key_env}
    if model:
        target["model"] = model
    names: list[str] = []
    inline: list[dict[str, Any]] = []
    for w in workloads:
        if isinstance(w, str):
            names.append(w)
        elif w.source == "preset":
            if w.name.startswith("context-sweep/"):
                if "context-sweep" not in names:
                    names.append("context-sweep")
            else:
                names.append(w.name)
        elif w.source not in ("inline", "file", "") and w.source.endswith(".toml"):
            if w.source not in names:
                names.append(w.source)
        else:
            d = {k: v for k, v in w.to_dict().items() if k != "source"}
            if not d.get("dataset"):
                d.pop("dataset", None)
            if w.description:
                d["description"] = w.description
            inline.append(d)
    load: dict[str, Any] = {"arrival": arrival, "warmup": warmup}
    if concurrency:
        load["concurrency"] = list(concurrency)
    if rates:
        load["rates"] = list(rates)
    if max_concurrency:
        load["max_concurrency"] = max_concurrency
    if requests is not None:
        load["requests"] = requests
    if duration is not None:
        load["duration"] = duration if isinstance(duration, str) else f"{_fmt_num(float(duration))}s"
    if timeout:
        load["timeout"] = timeout
    out: dict[str, Any] = {"sweep_version": SWEEP_VERSION}
    if name:
        out["name"] = name
    out["target"] = target
    if names:
        out["workloads"] = names
    if inline:
        out["workload"] = inline
    out["load"] = load
    if slos:
        out["slo"] = dict(slos)
    if tags:
        out["tags"] = dict(tags)
    if launch:
        server: dict[str, Any] = {"launch": launch}
        if launch_timeout:
            server["launch_timeout"] = launch_timeout
        if recover_timeout:
            server["recover_timeout"] = recover_timeout
        if variants:
            server["variants"] = [{"args": v} for v in variants]
        out["server"] = server
    return out


def save_sweep(path: str | Path, **kwargs: Any) -> Path:
    """Write a sweep TOML file (see `sweep_table` for the arguments); returns the path. The API key is
    never written, only the name of the variable that holds it."""
    p = Path(path)
    table = sweep_table(**kwargs)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(f"# servescope sweep: run it with `servescope run --sweep {p.name}`\n" + tomli_w.dumps(table),
                       encoding="utf-8")
        tmp.replace(p)
    except OSError as e:
        raise ServescopeError(f"cannot write {p}: {e.strerror}; choose another path") from None
    return p


def plan_from_sweep(sweep: dict[str, Any], url: str, label: str | None = None, *, api_key: str | None = None,
                    sessions_dir: Path | None = None) -> Any:
    """A SweepPlan from `load_sweep()`'s dict. `url` is the real base URL (sim:// already started)."""
    from servescope.sessions.runner import SweepPlan

    conc = sweep.get("concurrency")
    rate = sweep.get("rate")
    return SweepPlan(
        url=url,
        workloads=list(sweep["workloads"]),
        concurrency=_int_list(conc, "concurrency") if conc else None,
        rates=_float_list(rate, "rate") if rate else None,
        arrival=sweep.get("arrival") or "poisson",
        max_concurrency=sweep.get("max_concurrency"),
        requests=sweep.get("requests"),
        duration_s=parse_duration(sweep["duration"], "duration") if sweep.get("duration") else None,
        warmup=int(sweep.get("warmup") or 0),
        slos=dict(sweep.get("slos") or {}),
        tags=dict(sweep.get("tags") or {}),
        model=sweep.get("model"),
        api_key=api_key,
        timeout_s=parse_duration(sweep.get("timeout") or "600s", "timeout"),
        sessions_dir=sessions_dir,
        name=sweep.get("name") or "",
        target_label=label,
        launch=sweep.get("launch") or None,
        launch_timeout_s=parse_duration(sweep.get("launch_timeout") or "900s", "launch_timeout"),
        variants=list(sweep.get("server_variant") or []),
        recover_timeout_s=parse_duration(sweep.get("recover_timeout") or "300s", "recover_timeout"),
    )
