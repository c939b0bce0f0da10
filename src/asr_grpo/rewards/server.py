"""Serve a reward over HTTP: the server side of OpenRLHF's remote reward contract.

    asr-grpo-reward-server --reward-file my_reward.py --port 5000 --concurrency 4

`POST /score` (also `/get_reward`, OpenRLHF's usual path, and `/`) takes
`{"query": [...], "prompts": [...], "labels": [...], ...extra fields}` and answers
`{"rewards": [...], "scores": [...], "extra_logs": {name: [...]}}`; `GET /health` says
how busy it is. The reward file is called through `call_reward_function`, the same call
the training loop's reward worker makes, so a file behaves alike served or local.
docs/reward-server.md has the fields, status codes and replicas.

Starlette + uvicorn rather than Ray Serve: the box that serves a judge needs no Ray
cluster, and uvicorn's `--workers` supervisor already gives replicas as processes on
one port.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import logging
import math
import os
import sys
import time
from typing import Any, Mapping

import anyio  # comes with starlette (its thread pool)
import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from asr_grpo.rewards.combine import RewardResult
from asr_grpo.rewards.loader import (
    BUILTIN_REWARD_FILE,
    RewardCallFailed,
    RewardFunctionError,
    RewardTimeout,
    call_reward_function,
    hung_reward_calls,
    load_reward_function,
    to_reward_result,
)

log = logging.getLogger(__name__)

SCORE_PATHS = ("/score", "/get_reward", "/")
_SETTINGS_ENV = "ASR_GRPO_REWARD_SERVER_SETTINGS"   # how --workers processes get the settings
_WORKER_HEALTHCHECK_S = 60

REQUIRED = ("query", "prompts", "labels")
# Per-sample fields this toolkit sends: name -> (what one value must be, its check).
# Other fields pass through to reward_func unchecked (a user's file may want them).
_is_str = lambda v: isinstance(v, str)   # noqa: E731
_is_number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)   # noqa: E731
PER_SAMPLE = {
    "query": ("a string", _is_str),
    "prompts": ("a string", _is_str),
    "labels": ("a string", _is_str),
    "responses": ("a string", _is_str),
    "languages": ("a string", _is_str),
    "finish_reasons": ("a string", _is_str),
    "keywords": ("a list of strings", lambda v: isinstance(v, list) and all(map(_is_str, v))),
    "durations": ("a number", _is_number),
    "sample_ids": ("a string or an integer", lambda v: _is_str(v) or (isinstance(v, int) and not isinstance(v, bool))),
}
# call_reward_function's own parameters cannot be request fields (`queries` is sent as `query`).
RESERVED = frozenset(inspect.signature(call_reward_function).parameters) - {"prompts", "labels", "sample_ids", "kwargs"}


class BadRequest(ValueError):
    """The request breaks the contract (answered 400)."""


def check_weights(weights: Any, where: str) -> dict[str, float]:
    if not (isinstance(weights, dict) and all(isinstance(k, str) and _is_number(v) for k, v in weights.items())):
        raise BadRequest(f"{where} must be a JSON object of component -> number, got {json.dumps(weights)[:100]}")
    return weights


def parse_request(raw: bytes, default_weights: Mapping[str, float] | None = None) -> dict[str, Any]:
    """A request body -> call_reward_function's keyword arguments, or BadRequest with a
    one-line reason."""
    try:
        body = json.loads(raw)
    except ValueError as exc:   # JSONDecodeError and UnicodeDecodeError alike
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    missing = [k for k in REQUIRED if k not in body]
    if missing:
        raise BadRequest(f"missing fields {missing} (the contract: query, prompts, labels)")
    if clash := sorted(RESERVED & body.keys()):
        raise BadRequest(f"fields {clash} are reserved (send the queries as 'query')")
    if not isinstance(body["query"], list):
        raise BadRequest(f"'query' must be a list, got {type(body['query']).__name__}")
    n = len(body["query"])
    for name, (what, ok) in PER_SAMPLE.items():
        if name not in body:
            continue
        value = body[name]
        if not isinstance(value, list) or len(value) != n:
            got = f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
            raise BadRequest(f"{name!r} must be a list with one value per query ({n}), got {got}")
        if (bad := next((i for i, v in enumerate(value) if not ok(v)), None)) is not None:
            raise BadRequest(f"{name}[{bad}] must be {what}, got {json.dumps(value[bad])[:100]}")
    if "weights" in body:
        check_weights(body["weights"], "'weights'")
    elif default_weights:
        body["weights"] = dict(default_weights)
    body["queries"] = body.pop("query")
    return body


def _json_floats(t: torch.Tensor) -> list[float | None]:
    """Strict JSON has no NaN: a non-finite value goes out as null (the client reads NaN)."""
    return [v if math.isfinite(v) else None for v in t.tolist()]


def to_contract(result: RewardResult) -> dict[str, Any]:
    return {"rewards": _json_floats(result.total), "scores": _json_floats(result.scores),
            "extra_logs": {k: _json_floats(v) for k, v in result.components.items()}}


def _one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).splitlines())


def _error(status: int, reason: BaseException | str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": _one_line(reason)}, status_code=status, headers=headers)


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    reward_file: str = ""                      # "" -> the built-in ASR reward
    weights: dict[str, float] | None = None    # used when a request sends none
    concurrency: int = 4                       # requests scored at once (threads)
    max_queue: int = 16                        # requests waiting for a thread; beyond: 429
    # Under the client's default reward.remote.timeout_s (30 s), so it hears why.
    timeout_s: float = 25.0

    def __post_init__(self):
        if self.concurrency < 1 or self.max_queue < 0:
            raise ValueError("--concurrency must be >= 1 and --max-queue >= 0")


class RewardService:
    """One process's reward: the loaded file, a limiter of `concurrency` threads and the
    count of requests admitted (scoring or waiting). Counters live on the event loop's
    thread, so they need no lock; with --workers each process has its own."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.fn = load_reward_function(settings.reward_file)
        self.source = settings.reward_file or str(BUILTIN_REWARD_FILE)
        self.admitted = 0
        self.last_call_s = 1.0
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:   # made inside the event loop (older anyio needs one)
            self._limiter = anyio.CapacityLimiter(self.settings.concurrency)
        return self._limiter

    @property
    def in_flight(self) -> int:
        return int(self.limiter.borrowed_tokens)

    def score_batch(self, batch: Mapping[str, Any]) -> RewardResult:
        """Blocking: one validated reward_func call. Non-finite values are returned, not
        refused: the trainer's on_bad_reward policy (error | drop) decides, as it does
        for a local reward file."""
        raw: dict[str, Any] = {}

        @functools.wraps(self.fn)   # keeps its signature for whoever inspects which kwargs it takes
        def keep_output(*args, **kwargs):
            raw["out"] = out = self.fn(*args, **kwargs)
            return out

        t0 = time.monotonic()
        try:
            return call_reward_function(keep_output, timeout_s=self.settings.timeout_s, source=self.source,
                                        on_bad="error", **batch)
        except (RewardCallFailed, RewardTimeout):
            raise
        except RewardFunctionError:
            if "out" not in raw:
                raise
            # The output passed the call; if it also passes the contract checks, the
            # error was its non-finite values (a broken contract raises here again).
            return to_reward_result(raw["out"], len(batch["queries"]), self.source)
        finally:
            self.last_call_s = time.monotonic() - t0

    async def score(self, request: Request) -> JSONResponse:
        s = self.settings
        if self.admitted >= s.concurrency + s.max_queue:
            # A slot frees in about one call's time.
            retry_after = str(max(1, math.ceil(self.last_call_s)))
            return _error(429, f"busy: {self.in_flight} requests scoring, {self.admitted - self.in_flight} queued",
                          headers={"Retry-After": retry_after})
        self.admitted += 1   # no await since the check: admission cannot overshoot
        try:
            try:
                batch = parse_request(await request.body(), s.weights)
            except BadRequest as exc:
                return _error(400, exc)
            try:
                result = await anyio.to_thread.run_sync(self.score_batch, batch, limiter=self.limiter)
            except RewardTimeout as exc:
                # Maybe load, maybe a hang: the client retries 5xx (elsewhere where it can);
                # the hung thread keeps running and counts in /health's hung_calls.
                return _error(504, exc)
            except RewardFunctionError as exc:   # deterministic: retrying cannot help
                log.warning("%s", exc)
                return _error(422, exc)
            except Exception as exc:   # noqa: BLE001 - answered, and logged with its traceback
                log.exception("reward request failed")
                return _error(500, f"{type(exc).__name__}: {exc}")
            return JSONResponse(to_contract(result))
        finally:
            self.admitted -= 1

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "reward_file": self.source, "in_flight": self.in_flight,
                             "queued": self.admitted - self.in_flight, "hung_calls": hung_reward_calls(),
                             "pid": os.getpid()})


def build_app(settings: ServerSettings) -> Starlette:
    service = RewardService(settings)
    routes = [Route(p, service.score, methods=["POST"]) for p in SCORE_PATHS]
    routes.append(Route("/health", service.health, methods=["GET"]))
    app = Starlette(routes=routes)
    app.state.service = service
    return app


def app_from_env() -> Starlette:
    """The app factory each `--workers` process calls (settings come through the environment)."""
    return build_app(ServerSettings(**json.loads(os.environ[_SETTINGS_ENV])))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = ServerSettings()
    p = argparse.ArgumentParser(prog="asr-grpo-reward-server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default loopback: the reward file runs with this server's rights)")
    p.add_argument("--port", type=int, default=5000, help="default 5000")
    p.add_argument("--reward-file", default=d.reward_file, help="a reward_func file (default: the built-in ASR reward)")
    p.add_argument("--weights", type=json.loads, default=None,
                   help='JSON {component: weight}, used when a request sends no "weights"')
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="requests scored at once, per worker")
    p.add_argument("--max-queue", type=int, default=d.max_queue,
                   help="requests waiting beyond those, per worker; more are answered 429")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes on the one port")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s, help="per reward_func call (0: none)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = ServerSettings(reward_file=args.reward_file, concurrency=args.concurrency,
                                  max_queue=args.max_queue, timeout_s=args.timeout_s,
                                  weights=check_weights(args.weights, "--weights") if args.weights else None)
        app = build_app(settings)   # loads the reward file here: a broken one fails before serving
    except (ValueError, RewardFunctionError) as exc:
        sys.exit(f"asr-grpo-reward-server: {exc}")
    if args.workers > 1:
        os.environ[_SETTINGS_ENV] = json.dumps(dataclasses.asdict(settings))
        # A spawned worker re-imports this module (torch) before it answers the
        # supervisor's ping; the 5 s default would kill one still importing on a busy box.
        uvicorn.run("asr_grpo.rewards.server:app_from_env", factory=True, workers=args.workers,
                    host=args.host, port=args.port, log_level=args.log_level,
                    timeout_worker_healthcheck=_WORKER_HEALTHCHECK_S)
    else:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
