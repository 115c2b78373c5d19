"""The simulator's HTTP server: vLLM 0.32's OpenAI-compatible API over the engine, in real time.

`SimServer` reads and checks the requests, hands them to the engine loop (`servescope.sim.engineloop`,
which runs the scheduler against the event loop's clock) and writes the answers
(`servescope.sim.responses`); `Faults` are the failures it can be told to simulate. A request that asks for
log-probabilities, or whose prompt is one of the quality probe's tasks, gets its whole output planned first by
the toy model (`servescope.sim.quality`); the engine times it as any other.

With prefix caching on (the default, as in vLLM), the prompt is tokenized (a chat's as its rendered ChatML
text) and the engine gets its token ids and the output ids the client will get, for the block hashes of
`servescope.sim.prefixcache`; the usage then carries `prompt_tokens_details.cached_tokens`, always (vLLM
sends it only with `--enable-prompt-tokens-details`, and leaves it out when the count is 0).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import sys
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec
from aiohttp import web

from servescope.sim.engine import Scheduler
from servescope.sim.engineloop import EngineLoop
from servescope.sim.hosted import (
    SERVER_ONLY_PATHS,
    Hosted,
    TokenBucket,
    close_after,
    middlewares,
    not_served,
    openai_error,
    rate_limited,
    vllm_field,
)
from servescope.sim.metrics import Metrics
from servescope.sim.model import ToyModel
from servescope.sim.profile import CostModel, Profile
from servescope.sim.quality import LogprobParamError, Plan, build_plan, logprob_params, temperature_of
from servescope.sim.quality import full_response as planned_response
from servescope.sim.request import SimRequest
from servescope.sim.responses import Channel, TokenSource, error_response, full_response, stream_response
from servescope.sim.specdecode import default_acceptance
from servescope.sim.tasks import Task, find_task
from servescope.sim.tasks import answer as answer_task
from servescope.sim.tokenizer import Tokenizer, render_chat

log = logging.getLogger("servescope.sim")
_json_encode = msgspec.json.encode
_json_decode = msgspec.json.decode


@dataclass
class Faults:
    exit_after_requests: int = 0
    exit_at: float = 0.0
    error_rate: float = 0.0
    cut_stream_rate: float = 0.0
    seed: int = 0
    usage_factor: float = 1.0  # the final usage says this many times the tokens streamed (a server that miscounts)


def _int(v: object) -> int:
    """int() of a JSON value; a list or an object raises the TypeError int() itself would (answered 400)."""
    if isinstance(v, (int, float, str)):
        return int(v)
    raise TypeError(f"int() argument must be a string, a bytes-like object or a real number, not '{type(v).__name__}'")


class _BadRequest(Exception):
    pass


class SimServer:
    def __init__(self, profile: Profile, faults: Faults | None = None, hosted: Hosted | None = None,
                 adapters: Mapping[str, str] | None = None) -> None:
        self.profile = profile
        self.adapters = dict(adapters or {})  # LoRA adapters (--lora-modules): name -> path
        self.hosted = hosted or Hosted()
        self.bucket: TokenBucket | None = None  # the tokens-per-minute limit, from the engine's start
        self.cost = CostModel(profile)
        self.faults = faults or Faults()
        self.model_name = profile.model.served_name
        self.tokenizer = Tokenizer(add_bos_token=profile.model.add_bos_token)
        self.metrics = Metrics(self.model_name)
        self.max_model_len = self._effective_max_model_len()
        self.prefix_caching = profile.engine.enable_prefix_caching
        self.rng = random.Random(self.faults.seed)
        self.completed = 0
        self._rid = 0
        self.engine: EngineLoop | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._model_bytes = _json_encode(self.model_name)

    def _effective_max_model_len(self) -> int:
        mml = self.profile.model.max_model_len
        if self.cost.blocks_for(mml) <= self.cost.num_blocks:
            return mml
        lo, hi = 0, mml  # the longest request the whole cache holds
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.cost.blocks_for(mid) <= self.cost.num_blocks:
                lo = mid
            else:
                hi = mid - 1
        log.warning("KV cache holds only %d tokens for one request: max_model_len lowered from %d", lo, mml)
        return lo

    # --- app ---------------------------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares(self.hosted))
        if self.hosted.hosted:  # a hosted API serves none of a vLLM server's own paths
            for path in SERVER_ONLY_PATHS:
                app.router.add_route("*", path, self.not_served)
        else:
            app.router.add_get("/health", self.health)
            app.router.add_get("/ping", self.health)
            app.router.add_get("/version", self.version)
            app.router.add_get("/metrics", self.metrics_endpoint)
            app.router.add_post("/tokenize", self.tokenize)
            app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
            app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        if self.hosted.close_connections:
            app.on_response_prepare.append(close_after)
        app.on_startup.append(self._start_engine)
        app.on_cleanup.append(self._stop_engine)
        return app

    async def _start_engine(self, app: web.Application) -> None:
        self.engine = EngineLoop(self.cost, self.metrics)
        self._engine_task = asyncio.create_task(self.engine.run())
        if self.hosted.tpm > 0:
            self.bucket = TokenBucket(self.hosted.tpm, asyncio.get_running_loop().time())
        if self.faults.exit_at > 0:
            asyncio.get_running_loop().call_later(self.faults.exit_at, self._crash, "--exit-at")

    async def _stop_engine(self, app: web.Application) -> None:
        if self._engine_task is not None:
            self._engine_task.cancel()

    def _crash(self, why: str) -> None:
        log.error("servescope-sim: exiting abruptly (%s), as a crashed server would", why)
        sys.stderr.flush()
        os._exit(1)

    # --- simple endpoints --------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def not_served(self, request: web.Request) -> web.Response:
        return not_served(request)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0-sim"})

    async def models(self, request: web.Request) -> web.Response:
        if self.hosted.hosted:  # a hosted API's model card: no max_model_len, no root
            short = {"id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "servescope-sim"}
            return web.Response(body=_json_encode({"object": "list", "data": [short]}), content_type="application/json")
        card = {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "servescope-sim",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [],
        }
        cards: list[dict[str, object]] = [card]
        for name, path in self.adapters.items():  # as vLLM lists its LoRA modules: the base model as parent
            cards.append({**card, "id": name, "root": path, "parent": self.model_name, "max_model_len": None})
        return web.Response(body=_json_encode({"object": "list", "data": cards}), content_type="application/json")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's `POST /reset_prefix_cache` (served with VLLM_SERVER_DEV_MODE=1): {"success": bool}; it fails
        while requests run, unless `reset_running_requests=true` (they are preempted first, as vLLM does)."""
        log.info("Resetting prefix cache...")
        if self.engine is None:
            return web.json_response({"success": False})
        sched = self.engine.sched
        if request.query.get("reset_running_requests", "").lower() in ("1", "true", "yes"):
            sched.preempt_all()
        return web.json_response({"success": sched.pool.reset(len(sched.running))})

    def cache_info(self) -> dict[str, str]:
        e = self.profile.engine
        return {
            "block_size": str(e.block_size),
            "cache_dtype": self.profile.model.kv_cache_dtype,
            "enable_prefix_caching": str(e.enable_prefix_caching),
            "gpu_memory_utilization": str(e.gpu_memory_utilization),
            "kv_cache_max_concurrency": f"{self.cost.max_concurrency(self.max_model_len):.2f}",
            "kv_cache_size_tokens": str(self.cost.kv_cache_tokens),
            "num_gpu_blocks": str(self.cost.num_blocks),
        }

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        s = self.engine.sched if self.engine else Scheduler(self.cost)
        text = self.metrics.render(
            running=len(s.running),
            waiting=len(s.waiting),
            kv_usage=s.kv_usage,
            preemptions=s.num_preemptions,
            prompt_tokens=s.prompt_tokens_total,
            generation_tokens=s.generation_tokens_total,
            prefix_queries=s.prefix_queries,
            prefix_hits=s.prefix_hits,
            cache_info=self.cache_info(),
        )
        extra: list[str] = []
        if s.spec_counters is not None:
            s.spec_counters.render(self.metrics.labels, extra)
        if s.lora_info is not None:
            s.lora_info.render(extra)
        if extra:
            text += "\n".join(extra) + "\n"
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _json_body(self, request: web.Request) -> dict[str, object]:
        try:
            body = _json_decode(await request.read())
        except msgspec.DecodeError as e:
            raise _BadRequest(f"Invalid JSON body: {e}") from None
        if not isinstance(body, dict):
            raise _BadRequest("The request body must be a JSON object")
        return body

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._json_body(request)
            prompt = body.get("prompt")
            if "messages" in body:
                msgs = body["messages"]
                if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
                    raise _BadRequest("'messages' must be a list of objects with 'role' and 'content'")
                text = render_chat(msgs, bool(body.get("add_generation_prompt", True)))
                ids = self.tokenizer.encode(text, bool(body.get("add_special_tokens", False)))
            elif isinstance(prompt, str):
                ids = self.tokenizer.encode(prompt, bool(body.get("add_special_tokens", True)))
            else:
                raise _BadRequest("Either 'prompt' (a string) or 'messages' is required")
        except _BadRequest as e:
            return error_response(400, str(e), "BadRequestError")
        return web.Response(
            body=_json_encode({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None}),
            content_type="application/json",
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._json_body(request)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not self.tokenizer.valid_ids(ids):
                raise _BadRequest(f"'tokens' must be a list of token ids in [0, {self.tokenizer.vocab_size})")
        except _BadRequest as e:
            return error_response(400, str(e), "BadRequestError")
        return web.json_response({"prompt": self.tokenizer.decode(ids)})

    # --- generation --------------------------------------------------------------------------------------
    def _check_model(self, body: Mapping[str, object]) -> web.Response | None:
        model = body.get("model")
        if model is not None and model != self.model_name and not (isinstance(model, str) and model in self.adapters):
            return error_response(404, f"The model `{model}` does not exist.", "NotFoundError")
        return None

    def _adapter(self, body: Mapping[str, object]) -> str | None:
        """The LoRA adapter a request names as its model (None: the base model)."""
        model = body.get("model")
        return model if isinstance(model, str) and model != self.model_name and model in self.adapters else None

    @staticmethod
    def _acceptance(body: Mapping[str, object]) -> float | None:
        """Speculative decoding: the acceptance of drafted tokens the request's traffic has (vllm_xargs's
        spec_acceptance, 0..1), None when it does not say."""
        xargs = body.get("vllm_xargs")
        p = xargs.get("spec_acceptance") if isinstance(xargs, dict) else None
        if isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 <= p <= 1.0:
            return float(p)
        return None

    def _prompt(self, body: Mapping[str, object], chat: bool) -> tuple[int, int, list[int] | None, str | None]:
        """(prompt token count, content hash, token ids when the prefix cache needs them, the prompt's text: None
        for token ids) for a request body."""
        tok = self.tokenizer
        ids: list[int] | None
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise _BadRequest("'messages' must be a non-empty list")
            for m in msgs:
                if not isinstance(m, dict):
                    raise _BadRequest("each message must be an object with 'role' and 'content'")
            text = render_chat(msgs, add_generation_prompt=True)
            ids = tok.encode(text) if self.prefix_caching else None
            n = len(ids) if ids is not None else tok.count(text)
            return n, zlib.crc32(text.encode("utf-8", "replace")), ids, text
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            special = bool(body.get("add_special_tokens", True))
            ids = tok.encode(prompt, special) if self.prefix_caching else None
            n = len(ids) if ids is not None else tok.count(prompt, special)
            return n, zlib.crc32(prompt.encode("utf-8", "replace")), ids, prompt
        if isinstance(prompt, list) and prompt and tok.valid_ids(prompt):
            return len(prompt), zlib.crc32(_json_encode(prompt)), prompt, None
        raise _BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        arrival = loop.time()
        try:
            body = await self._json_body(request)
            bad = self._check_model(body)
            if bad is not None:
                return bad
            if self.hosted.reject_vllm_fields and (name := vllm_field(body)) is not None:
                return openai_error(400, f"Unrecognized request argument supplied: {name}", "invalid_request_error")
            prompt_len, phash, prompt_ids, prompt_text = self._prompt(body, chat)
            mml = self.max_model_len
            max_tokens = body.get("max_completion_tokens") if chat else None
            if max_tokens is None:
                max_tokens = body.get("max_tokens")
            if prompt_len >= mml:
                raise _BadRequest(
                    f"This model's maximum context length is {mml} tokens. However, your request has "
                    f"{prompt_len} input tokens. Please reduce the length of the input messages."
                )
            if max_tokens is None:
                max_tokens = mml - prompt_len if chat else 16
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
                raise _BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
            if prompt_len + max_tokens > mml:
                raise _BadRequest(
                    f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                    f"context length is {mml} tokens and your request has {prompt_len} input tokens "
                    f"({max_tokens} > {mml} - {prompt_len})."
                )
            if _int(body.get("n", 1) or 1) != 1:
                raise _BadRequest("servescope-sim supports n=1 only")
            min_tokens = _int(body.get("min_tokens", 0) or 0)
            ignore_eos = bool(body.get("ignore_eos", False))
            seed = body.get("seed")
            stream = bool(body.get("stream", False))
            sopts = body.get("stream_options") or {}
            if not isinstance(sopts, dict):
                sopts = {}
            include_usage = bool(sopts.get("include_usage", False))
            continuous = include_usage and bool(sopts.get("continuous_usage_stats", False))
            kwargs = body.get("chat_template_kwargs") or {}
            thinking = (
                chat
                and self.profile.model.reasoning
                and bool(kwargs.get("enable_thinking", self.profile.model.thinking_default) if isinstance(kwargs, dict) else False)
            )
            # the quality probe's requests (servescope.sim.quality): log-probabilities or an exact-answer task
            top, prompt_top = logprob_params(body, chat, stream)
            task = find_task(prompt_text) if prompt_text is not None else None
            planned = task is not None or top is not None or prompt_top is not None
            temperature = temperature_of(body) if planned else 0.0
        except LogprobParamError as e:
            return error_response(400, str(e), "BadRequestError")
        except _BadRequest as e:
            return error_response(400, str(e), "BadRequestError")
        except (TypeError, ValueError) as e:
            return error_response(400, f"Invalid request: {e}", "BadRequestError")

        if self.bucket is not None:
            now = loop.time()
            wait_s = self.bucket.take(prompt_len + max_tokens, now)
            if wait_s is not None:
                return rate_limited(self.model_name, self.bucket, wait_s, prompt_len + max_tokens, now)
        if self.faults.error_rate > 0 and self.rng.random() < self.faults.error_rate:
            return error_response(500, "Simulated internal server error (servescope-sim --error-rate)", "InternalServerError")
        cut_at = 0
        if stream and self.faults.cut_stream_rate > 0 and self.rng.random() < self.faults.cut_stream_rate:
            cut_at = 1 + self.rng.randrange(max(max_tokens - 1, 1))

        # where the output ends: exactly max_tokens with ignore_eos, else a deterministic EOS point
        h = zlib.crc32(f"{phash}:{seed}:{max_tokens}".encode())
        target = max_tokens
        if not ignore_eos and h % 2 == 0:
            lo = max(min_tokens, 1)
            if lo < max_tokens:
                target = lo + (h // 2) % (max_tokens - lo + 1)
        reasoning = 0
        if thinking:
            reasoning = min(int(self.profile.model.reasoning_fraction * max_tokens), target - 1) if target > 1 else 0

        self._rid += 1
        rid = self._rid
        chan = Channel()
        metrics = self.metrics

        # as in vLLM, the request's latencies in /metrics start when the engine gets it: after the API server's
        # own work (HTTP, chat template, tokenizer: the profile's frontend_ms), which a client's TTFT includes
        engine_arrival = arrival + self.cost.frontend_s

        def on_tokens(req: SimRequest, n: int, finished: bool, t: float) -> None:
            if req.num_output == 1:
                metrics.ttft.observe(t - engine_arrival)
            else:
                metrics.itl.observe(t - chan_last[0])
            chan_last[0] = t
            chan.pending += n
            if finished:
                chan.finished = True
                metrics.e2e.observe(t - engine_arrival)
                metrics.success[req.finish_reason] += 1
                sched_t = req.first_scheduled_t
                metrics.queue.observe(max(sched_t - engine_arrival, 0.0))
                metrics.prefill.observe(req.first_token_t - sched_t)
                metrics.decode.observe(t - req.first_token_t)
                if req.num_output > 1:
                    metrics.tpot.observe((t - req.first_token_t) / (req.num_output - 1))
                if self.engine is not None:
                    self.engine.wake.set()
            chan.event.set()

        chan_last = [arrival]
        gen_seed = h ^ rid if seed is None else h
        gen = TokenSource(gen_seed)
        plan: Plan | None = None
        if planned:
            if prompt_ids is None:
                prompt_ids = (self.tokenizer.encode(prompt_text, not chat and bool(body.get("add_special_tokens", True)))
                              if prompt_text is not None else [])
            plan, target, reasoning = await self._plan(
                prompt_ids, prompt_text or "", task, chat, max_tokens, min_tokens, ignore_eos, thinking, target,
                reasoning, top, prompt_top, temperature, gen_seed)
        out_ids = (plan.take if plan is not None else TokenSource(gen_seed).take) if self.prefix_caching else None
        adapter = self._adapter(body)
        req = SimRequest(rid, prompt_len, max_tokens, target, arrival, on_tokens, prompt_ids, out_ids, adapter,
                         self._acceptance(body))
        model_name = adapter if adapter is not None else self.model_name  # the answer names what was asked
        if self.cost.frontend_s > 0:
            await asyncio.sleep(arrival + self.cost.frontend_s - loop.time())
        assert self.engine is not None
        engine = self.engine
        engine.add(req, arrival + self.cost.frontend_s)
        created = int(time.time())
        try:
            if stream:
                return await stream_response(request, req, chan, gen, self.tokenizer,
                                             self._model_bytes if adapter is None else _json_encode(adapter), chat,
                                             created,
                                             prompt_len, reasoning, include_usage, continuous, cut_at,
                                             self.prefix_caching,
                                             None if plan is None else functools.partial(plan.piece, chat=chat),
                                             self.faults.usage_factor)
            while not chan.finished:
                await chan.event.wait()
                chan.event.clear()
            if plan is not None:
                return planned_response(req, plan, model_name, chat, created, prompt_len, reasoning,
                                        self.prefix_caching, prompt_ids if body.get("return_token_ids") else None)
            return full_response(req, gen, self.tokenizer, model_name, chat, created, prompt_len, reasoning,
                                 self.prefix_caching)
        finally:
            if req.done_t < 0:
                engine.abort(req)
            elif cut_at == 0 or cut_at >= req.num_output:
                self._count_completed()

    async def _plan(
        self, prompt_ids: list[int], text: str, task: Task | None, chat: bool, max_tokens: int, min_tokens: int,
        ignore_eos: bool, thinking: bool, target: int, reasoning: int, top: int | None, prompt_top: int | None,
        temperature: float, seed: int,
    ) -> tuple[Plan, int, int]:
        """The planned output of a quality request, its length and its reasoning tokens. A task's answer follows
        the reasoning (when thinking) and ends the output, unless `ignore_eos` or `min_tokens` ask for more (the
        model goes on); other requests keep the length and reasoning already drawn."""
        q = self.profile.quality
        forced: list[tuple[int, str]] = []
        if task is not None:
            given, _ = answer_task(task, text, len(prompt_ids), q.error_rate, q.long_context_error_per_16k, q.seed)
            forced = self.tokenizer.spans(given if chat else " " + given)
            reasoning = min(int(self.profile.model.reasoning_fraction * max_tokens), max_tokens - 1) if thinking else 0
            target = max_tokens if ignore_eos else min(max_tokens, max(reasoning + len(forced), min_tokens, 1))
            reasoning = min(reasoning, target - 1) if target > 1 else 0
        model = ToyModel(q.logit_noise, q.seed)
        work = target + (len(prompt_ids) if prompt_top is not None else 0)

        def build() -> Plan:
            return build_plan(model, self.tokenizer, prompt_ids, target, top, prompt_top, temperature, seed, forced,
                              reasoning)

        # a long plan (about 30 us a token) runs off the event loop, so that other requests' steps stay on time
        plan = build() if work < 1000 else await asyncio.get_running_loop().run_in_executor(None, build)
        return plan, target, reasoning

    def _count_completed(self) -> None:
        self.completed += 1
        n = self.faults.exit_after_requests
        if n > 0 and self.completed >= n:
            asyncio.get_running_loop().call_later(0.02, self._crash, f"--exit-after-requests {n}")

def startup_log_lines(server: SimServer) -> list[str]:
    cost = server.cost
    p = server.profile
    mml = server.max_model_len
    return [
        f"servescope-sim {p.name}: serving {p.model.served_name} as vLLM 0.32 would on {p.gpu.name} "
        f"(gpu_memory_utilization {p.engine.gpu_memory_utilization}, max_num_seqs {p.engine.max_num_seqs}, "
        f"max_num_batched_tokens {p.engine.max_num_batched_tokens})",
        f"Model loading took {cost.weights_gib():.2f} GiB of weights",
        f"GPU KV cache size: {cost.kv_cache_tokens:,} tokens",
        f"Maximum concurrency for {mml:,} tokens per request: {cost.max_concurrency(mml):.2f}x",
        *spec_lora_log_lines(server),
        *hosted_log_lines(server.hosted),
    ]


def spec_lora_log_lines(server: SimServer) -> list[str]:
    """What the simulator says about speculative decoding and LoRA at start, as vLLM does."""
    e = server.profile.engine
    out = []
    if e.speculative_method:
        acc = e.spec_acceptance or default_acceptance(e.speculative_method)
        out.append(f"Speculative decoding: method {e.speculative_method}, {e.num_speculative_tokens} speculative "
                   f"tokens (drafted tokens accepted at {acc:g} unless a request's vllm_xargs.spec_acceptance says)")
        if e.speculative_method in ("ngram", "suffix"):
            out.append(f"Async scheduling not supported with {e.speculative_method}-based speculative decoding and "
                       "will be disabled.")
    if e.enable_lora:
        out.append(f"LoRA: max_loras {e.max_loras}, max_lora_rank {e.max_lora_rank}")
        out += [f"Loaded new LoRA adapter: name '{n}', path '{p}'" for n, p in server.adapters.items()]
    return out


def hosted_log_lines(h: Hosted) -> list[str]:
    """What the simulator does beyond vLLM's behaviour, one line, when it does anything."""
    parts = ["hosted API (no /tokenize, /metrics, /health, /version)"] if h.hosted else []
    if h.tpm > 0:
        parts.append(f"{h.tpm:,} tokens per minute, then 429 with Retry-After")
    if h.delays:
        parts.append(f"network latency {h.latency_ms:g} ms + up to {h.jitter_ms:g} ms of jitter per request")
    if h.reject_vllm_fields:
        parts.append("vLLM's own request fields answered 400")
    if h.api_key is not None:
        parts.append("an API key required")
    if h.close_connections:
        parts.append("every connection closed after its response")
    return ["servescope-sim: " + "; ".join(parts)] if parts else []
