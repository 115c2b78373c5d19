"""Read a server launch command: `parse_launch()` and `with_variant()` build a `LaunchSpec`.

`parse_launch("vllm serve MODEL --gpu-memory-utilization 0.85")` reads the command the user would type
(no shell: `shlex` splitting, leading `KEY=VALUE` words become environment variables), adds
`--host 127.0.0.1 --port <free>` when absent, and keeps the arguments a comparison cares about
(quantization, KV dtype, memory utilisation...). `with_variant(spec, "--max-num-seqs 4")` overrides or
adds arguments for a server-config sweep. Running the command is `servescope.core.launch.ServerProcess`.

Accepted forms:
- `vllm serve MODEL [ARGS]` (or any path whose last part is `vllm`: `/opt/venv/bin/vllm serve ...`);
- `python -m vllm.entrypoints.openai.api_server --model MODEL [ARGS]`;
- `servescope sim [ARGS]` / `python -m servescope.sim [ARGS]`: the built-in simulator, a cheap way to
  test launching (its "model" is `--profile`).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from servescope.core.errors import ServescopeError
from servescope.core.secrets import is_redacted, redact_command
from servescope.core.textsafe import clean_text

__all__ = ["ArgValue", "INTERESTING", "LaunchSpec", "free_port", "lora_modules", "parse_launch", "with_variant"]

ArgValue = str | int | float | bool

# the arguments a comparison or a report cares about: name -> type
INTERESTING: dict[str, type] = {
    "quantization": str,
    "dtype": str,
    "kv_cache_dtype": str,
    "gpu_memory_utilization": float,
    "max_model_len": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "data_parallel_size": int,
    "enable_prefix_caching": bool,
    "enable_chunked_prefill": bool,
    "enforce_eager": bool,
    "num_gpu_blocks_override": int,
    "block_size": int,
    "served_model_name": str,
    "speculative_config": str,
    "enable_lora": bool,
    "max_loras": int,
    "max_lora_rank": int,
    "reasoning_parser": str,
    "swap_space": float,
    "cpu_offload_gb": float,
    "kv_cache_memory_bytes": str,
    "async_scheduling": bool,
    "kv_cache_tokens": int,  # simulator
    # llama.cpp's llama-server
    "ctx_size": int,
    "parallel": int,
    "n_gpu_layers": int,
    "cache_type_k": str,
    "cache_type_v": str,
    "flash_attn": str,
    "batch_size": int,
    "ubatch_size": int,
    "threads": int,
}

SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
               "-dp": "--data-parallel-size", "-q": "--quantization"}
# llama-server's short options (its README): every word starting with "-" is an option there
LLAMA_SHORT = {"-m": "--model", "-c": "--ctx-size", "-np": "--parallel", "-ngl": "--n-gpu-layers",
               "-t": "--threads", "-b": "--batch-size", "-ub": "--ubatch-size", "-fa": "--flash-attn",
               "-ctk": "--cache-type-k", "-ctv": "--cache-type-v", "-a": "--alias", "-cb": "--cont-batching"}
_LLAMA_BOOL = {"--metrics", "--cont-batching", "--mlock", "--no-mmap", "--embedding", "--embeddings", "--jinja",
               "--slots", "--props", "--verbose", "--no-webui", "--kv-unified", "--swa-full"}

# boolean flags (argparse BooleanOptionalAction / store_true) never take the next word as their value
_BOOL_EXACT = {"--enforce-eager", "--trust-remote-code", "--async-scheduling", "--list", "--headless",
               "--disable-log-stats", "--disable-log-requests", "--disable-fastapi-docs",
               "--skip-tokenizer-init", "--disable-frontend-multiprocessing"}
_BOOL_PREFIXES = ("--no-", "--enable-", "--disable-")

_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# options that take several words (argparse nargs="+"): kept as one value, its words shell-quoted and joined
MULTI_WORD = frozenset({"--lora-modules"})


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _is_bool_flag(flag: str) -> bool:
    return flag in _BOOL_EXACT or flag.startswith(_BOOL_PREFIXES)


def _split_options(words: list[str], what: str, kind: str = "vllm") -> list[tuple[str, str | None]]:
    """`--a 1 --b=2 --c -tp 2` -> [('--a', '1'), ('--b', '2'), ('--c', None), ('--tensor-parallel-size', '2')]."""
    shorts = LLAMA_SHORT if kind == "llamacpp" else SHORT_FLAGS
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("-") or w in ("-", "--"):
            raise ServescopeError(f"cannot read the launch command: unexpected word {clean_text(w)!r} in {what} "
                                  "(write every server option as --name VALUE)")
        if "=" in w and w.startswith("--"):
            flag, value = w.split("=", 1)
            out.append((flag, value))
            i += 1
            continue
        flag = shorts.get(w, w)
        if flag in MULTI_WORD:
            j = i + 1
            while j < len(words) and not words[j].startswith("-"):
                j += 1
            out.append((flag, shlex.join(words[i + 1:j]) if j > i + 1 else None))
            i = j
            continue
        nxt = words[i + 1] if i + 1 < len(words) else None
        boolean = _is_bool_flag(flag) or (kind == "llamacpp" and flag in _LLAMA_BOOL)
        is_option = nxt is not None and (nxt.startswith("--") or nxt in shorts
                                         or (kind == "llamacpp" and nxt.startswith("-") and not _number(nxt)))
        takes = nxt is not None and not boolean and not is_option
        if takes:
            out.append((flag, nxt))
            i += 2
        else:
            out.append((flag, None))
            i += 1
    return out


def _number(w: str) -> bool:
    try:
        float(w)
        return True
    except ValueError:
        return False


def _key(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _coerce(key: str, value: str | None) -> ArgValue:
    typ = INTERESTING.get(key, str)
    if value is None:
        return True
    if typ is bool:
        return value.lower() not in ("0", "false", "no", "off")
    if typ is int:
        try:
            return int(value)
        except ValueError:
            return value
    if typ is float:
        try:
            return float(value)
        except ValueError:
            return value
    return value


@dataclass(frozen=True)
class LaunchSpec:
    """A server command ready to run. `argv` is what is executed (a list, never a shell)."""

    command: str  # as the user wrote it
    kind: str  # "vllm", "llamacpp" or "sim"
    head: tuple[str, ...]  # executable and subcommand words, e.g. ('vllm', 'serve', 'MODEL')
    options: tuple[tuple[str, str | None], ...]  # ('--flag', 'value' or None), --host/--port included
    model: str
    host: str
    port: int
    env: dict[str, str] = field(default_factory=dict)  # KEY=VALUE words before the command

    @property
    def argv(self) -> list[str]:
        out = list(self.head)
        for flag, value in self.options:
            out.append(flag)
            if value is not None:
                out.extend(shlex.split(value) if flag in MULTI_WORD else [value])
        return out

    @property
    def url(self) -> str:
        host = self.host
        if host in ("0.0.0.0", "", "::", "[::]"):
            host = "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def server_args(self) -> dict[str, ArgValue]:
        """The interesting arguments, typed: {'gpu_memory_utilization': 0.85, 'enable_prefix_caching': False, ...}."""
        out: dict[str, ArgValue] = {}
        for flag, value in self.options:
            key = _key(flag)
            if key.startswith("no_") and key[3:] in INTERESTING and value is None:
                out[key[3:]] = False
            elif key in INTERESTING:
                out[key] = _coerce(key, value)
        return out

    @property
    def args(self) -> dict[str, str | bool]:
        """Every option as given (values as strings, flags without a value as True)."""
        return {_key(f): (True if v is None else v) for f, v in self.options}

    def shell_line(self) -> str:
        """A copy-pasteable rendering (for logs and reports; never executed through a shell), its secrets
        (`--api-key`, `*_API_KEY=`, `*TOKEN*=` values...) replaced by ••••."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return redact_command(" ".join([*env, *(shlex.quote(a) for a in self.argv)]))

    def with_adapters(self, names: Sequence[str], lora_dir: str | None) -> LaunchSpec:
        """This command serving the LoRA adapters `names`: `--enable-lora` added, and `--lora-modules NAME=PATH` for
        each adapter it does not list (PATH: `lora_dir`/NAME; the simulator reads no path, so without a folder it
        gets the name). A vLLM or llama.cpp command missing an adapter and given no folder: one line saying how."""
        return _with_adapters(self, names, lora_dir)

    @property
    def redacted(self) -> str:
        """The command as the user wrote it, its secrets replaced by ••••: what may be shown or stored."""
        return redact_command(self.command)


def _refuse_redacted(command: str, what: str) -> None:
    """A command stored with its secrets replaced by •••• cannot be run: ask for it in full."""
    if is_redacted(command):
        raise ServescopeError(
            f"the {what} {clean_text(command)!r} holds •••• where a secret was (servescope never stores "
            "secrets): give the whole command again, e.g. --launch \"vllm serve MODEL --api-key ...\" "
            "(to continue a session: servescope resume SESSION --launch \"...\")")


def _set_option(options: list[tuple[str, str | None]], flag: str, value: str | None) -> None:
    """Replace every occurrence of `flag` (and of its --no- twin) by one, at the first one's place."""
    base = flag[5:] if flag.startswith("--no-") else flag[2:]
    twins = {f"--{base}", f"--no-{base}"}
    at = next((i for i, (f, _) in enumerate(options) if f in twins), None)
    options[:] = [(f, v) for f, v in options if f not in twins]
    if at is None:
        options.append((flag, value))
    else:
        options.insert(min(at, len(options)), (flag, value))


def parse_launch(command: str) -> LaunchSpec:
    """Read a server command line; raises ServescopeError (one line) when it is not one we can launch."""
    _refuse_redacted(command, "launch command")
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise ServescopeError(f"cannot read the launch command: {e}") from None
    env: dict[str, str] = {}
    while words and _ENV_WORD.match(words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    if not words:
        raise ServescopeError("the launch command is empty: give e.g. --launch \"vllm serve MODEL --port 8000\"")
    exe = words[0]
    base = os.path.basename(exe)
    model_in_options = False
    kind = "vllm"
    if base == "vllm":
        if len(words) < 2 or words[1] != "serve":
            raise ServescopeError(f"the launch command must be `{clean_text(exe)} serve MODEL ...` "
                                  f"(got {clean_text(' '.join(words[:2]))!r})")
        if len(words) >= 3 and not words[2].startswith("-"):
            head, rest = [exe, "serve", words[2]], words[3:]
        else:
            head, rest, model_in_options = [exe, "serve"], words[2:], True
    elif base.startswith("python") and len(words) >= 3 and words[1] == "-m":
        module = words[2]
        if module in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
            head, rest, model_in_options = words[:3], words[3:], True
        elif module == "servescope.sim":
            kind = "sim"
            head, rest = words[:3], words[3:]
        else:
            raise ServescopeError(f"cannot launch `python -m {clean_text(module)}`: use `vllm serve MODEL ...`, "
                                  "`python -m vllm.entrypoints.openai.api_server --model MODEL ...` or `servescope sim ...`")
    elif base == "servescope" and len(words) >= 2 and words[1] == "sim":
        kind = "sim"
        head, rest = [sys.executable, "-m", "servescope.sim"], words[2:]
    elif base == "llama-server":
        kind = "llamacpp"
        head, rest, model_in_options = [exe], words[1:], True
    else:
        raise ServescopeError(f"cannot launch {clean_text(exe)!r}: the command must start with `vllm serve MODEL` "
                              "(or a path ending in vllm, or `python -m vllm.entrypoints.openai.api_server`) or "
                              "`llama-server -m MODEL.gguf`")
    options = _split_options(rest, "the server options", kind)
    model = ""
    if kind == "sim":
        model = next((v for f, v in options if f == "--profile" and v), "tiny")
    elif model_in_options:
        model = next((v for f, v in options if f == "--model" and v), "")
        if not model:
            raise ServescopeError("the launch command names no model: write `vllm serve MODEL ...` or `--model MODEL`"
                                  + (" (llama-server: -m MODEL.gguf)" if kind == "llamacpp" else ""))
    else:
        model = head[2]
    host = next((v for f, v in options if f == "--host" and v), None)
    port_s = next((v for f, v in options if f == "--port" and v), None)
    if host is None:
        host = "127.0.0.1"
        _set_option(options, "--host", host)
    if port_s is None or port_s == "0":
        port = free_port()
        _set_option(options, "--port", str(port))
    else:
        try:
            port = int(port_s)
        except ValueError:
            raise ServescopeError(f"the launch command's --port {clean_text(port_s)!r} is not a number") from None
    if kind == "llamacpp" and not any(f == "--metrics" for f, _ in options):
        options.append(("--metrics", None))  # its /metrics: servescope's server figures
    return LaunchSpec(command=command, kind=kind, head=tuple(head), options=tuple(options), model=model,
                      host=host, port=port, env=env)


def with_variant(spec: LaunchSpec, variant_args: str) -> LaunchSpec:
    """`spec` with the options of `variant_args` (e.g. "--gpu-memory-utilization 0.70") overriding or added.
    A `--no-X` in the variant replaces `--X` and the other way round."""
    _refuse_redacted(variant_args, "server variant")
    try:
        words = shlex.split(variant_args)
    except ValueError as e:
        raise ServescopeError(f"cannot read the server variant {clean_text(variant_args)!r}: {e}") from None
    options = list(spec.options)
    for flag, value in _split_options(words, "the server variant", spec.kind):
        _set_option(options, flag, value)
    host = next((v for f, v in options if f == "--host" and v), spec.host)
    port_s = next((v for f, v in options if f == "--port" and v), str(spec.port))
    try:
        port = int(port_s)
    except ValueError:
        raise ServescopeError(f"the server variant's --port {clean_text(port_s)!r} is not a number") from None
    if port == 0:
        port = free_port()
        _set_option(options, "--port", str(port))
    model = spec.model
    if spec.kind == "sim":
        model = next((v for f, v in options if f == "--profile" and v), model)
    else:
        model = next((v for f, v in options if f == "--model" and v), model)
    return replace(spec, options=tuple(options), host=host, port=port, model=model)


def lora_modules(spec: LaunchSpec) -> dict[str, str]:
    """The adapters a launch command serves (`--lora-modules NAME=PATH ...`, or JSON objects with name and path)."""
    import json

    out: dict[str, str] = {}
    for flag, value in spec.options:
        if flag != "--lora-modules" or not value:
            continue
        for item in shlex.split(value):
            if "=" in item and not item.lstrip().startswith("{"):
                name, path = item.split("=", 1)
                out[name] = path
            else:
                try:
                    d = json.loads(item)
                    out[str(d["name"])] = str(d["path"])
                except (ValueError, TypeError, KeyError):
                    continue
    return out


def _with_adapters(spec: LaunchSpec, names: Sequence[str], lora_dir: str | None) -> LaunchSpec:
    """LaunchSpec.with_adapters."""
    if not names:
        return spec
    listed = lora_modules(spec)
    missing = [n for n in names if n not in listed]
    if missing and lora_dir is None and spec.kind != "sim":
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ServescopeError(f"the workload's LoRA adapters {shown} are not in the launch command's --lora-modules: "
                              "give --lora-dir DIR (the adapters in DIR/NAME) or add --lora-modules NAME=PATH to "
                              "the command")
    options = list(spec.options)
    if not any(f == "--enable-lora" for f, _ in options):
        options.append(("--enable-lora", None))
    if missing:
        items = [f"{n}={listed[n]}" for n in listed] + [
            f"{n}={os.path.join(lora_dir, n) if lora_dir is not None else n}" for n in missing]
        _set_option(options, "--lora-modules", shlex.join(items))
    return replace(spec, options=tuple(options))
