"""A stand-in model server: a TEST DOUBLE of an OpenAI-compatible chat API, for tests and demos.

It is not a model and not for production (production points `model_url` at a real provider).
It serves `POST /v1/chat/completions` with deterministic replies and word-count token usage,
answers with scripted tool calls when given a scenario (`Scenario`), and misbehaves on request
through its knobs (`Knobs`). The same answers come in OpenAI Responses' shape from
`POST /v1/responses` and in Anthropic Messages' from `POST /v1/messages`, each of which refuses
a request outside its API's documented shape (`examples/standin_apis.py`). Its admin endpoint
has no authentication: bind it to 127.0.0.1 only. It lives outside the installed package
because a runner-only install has neither Starlette nor uvicorn.
"""

from __future__ import annotations

import dataclasses
import hmac
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from examples import standin_apis
from tether.cli import Parser
from tether.wire import canonical_json, sha256_hex
from tether.wire.payloads import with_hint

_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
_KNOB_TYPES: dict[str, tuple[type, ...]] = {
    "latency_s": (int, float),
    "latency_spread": (int, float),
    "fail_429": (int,),
    "retry_after_s": (int, float),
    "fail_500": (int,),
    "quota_exhausted": (bool,),
    "expected_key": (str, type(None)),
}


@dataclasses.dataclass(kw_only=True)
class Knobs:
    """How the stand-in misbehaves; mutable at run time through `/_admin/knobs`.

    Applied to each call in this order: a wrong or missing key while `expected_key` is set gets
    401; `quota_exhausted` gets 429 `insufficient_quota` (never retried by the runner);
    `fail_429` gives the next N calls 429 with `Retry-After: retry_after_s`; `fail_500` gives
    the next N calls 500; `latency_s` delays every reply, spread by `latency_spread`
    (`latency_for`).
    """

    latency_s: float = 0.0
    latency_spread: float = 0.0
    fail_429: int = 0
    retry_after_s: float = 1.0
    fail_500: int = 0
    quota_exhausted: bool = False
    expected_key: str | None = None

    def public(self) -> dict[str, Any]:
        shown = dataclasses.asdict(self)
        shown["key_required"] = shown.pop("expected_key") is not None
        return shown

    def update(self, changes: Any) -> str | None:
        """Apply `changes`, all or nothing; return an error text for bad input."""
        if not isinstance(changes, dict):
            return "body must be a JSON object"
        for key, value in changes.items():
            types = _KNOB_TYPES.get(key)
            if types is None:
                return f"unknown knob {key!r} (known: {', '.join(sorted(_KNOB_TYPES))})"
            if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
                return f"knob {key!r} has the wrong type"
            if isinstance(value, int | float) and not isinstance(value, bool):
                if not math.isfinite(value):
                    return f"knob {key!r} must be a finite number"
                if value < 0:
                    return f"knob {key!r} must not be negative"
                if key == "latency_spread" and value > 1:
                    return "knob 'latency_spread' must be 0..1"
        for key, value in changes.items():
            setattr(self, key, value)
        return None


NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
HOLD_MAX_S = 86_400.0  # a turn's hold: a day at most (a "blocked" turn in a demo)


class ScriptedCall(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tool call a scripted turn makes. `arguments` is sent as the model sends it, JSON text:
    an object is encoded, a string is sent as it is (so a test can send broken JSON)."""

    name: NonEmpty
    arguments: dict[str, Any] | str = msgspec.field(default_factory=dict)
    id: NonEmpty | None = None


class Turn(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One scripted answer, `text` or `tool_calls`, and the conversations it answers: those
    with `assistant_turns` assistant messages so far and whose last message's content holds
    `last_contains`; a condition left out always holds.

    `hold_s` holds the answer that long (on top of the `latency_s` knob), for the first
    `holds` requests this turn answers (all of them when left out): a demo can kill a runner
    while it waits mid-loop, and the attempt that resumes is answered at once. `POST
    /_admin/release` ends the holds under way, so a test decides when a held answer comes.
    """

    name: NonEmpty
    assistant_turns: Annotated[int, msgspec.Meta(ge=0)] | None = None
    last_contains: NonEmpty | None = None
    text: str | None = None
    tool_calls: tuple[ScriptedCall, ...] = ()
    hold_s: Annotated[float, msgspec.Meta(ge=0, le=HOLD_MAX_S)] = 0.0
    holds: Annotated[int, msgspec.Meta(ge=1)] | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (not self.tool_calls):
            raise ValueError("a turn answers with exactly one of `text` and `tool_calls`")

    def matches(self, messages: list[dict[str, Any]]) -> bool:
        if self.assistant_turns is not None:
            done = sum(1 for m in messages if m.get("role") == "assistant")
            if done != self.assistant_turns:
                return False
        if self.last_contains is not None:
            return self.last_contains in (messages[-1].get("content") or "")
        return True


class Scenario(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The stand-in's script: the first turn (in order) that matches a request answers it; a
    request no turn matches gets the echo answer. The same conversation always gets the same
    turn, so a client that asks again for a turn it already had shows in the call log."""

    turns: tuple[Turn, ...] = ()

    def __post_init__(self) -> None:
        names = [turn.name for turn in self.turns]
        if len(set(names)) != len(names):
            raise ValueError("turn names must differ (the call log names turns)")

    def turn_for(self, messages: list[dict[str, Any]]) -> Turn | None:
        return next((turn for turn in self.turns if turn.matches(messages)), None)


def read_scenario(data: Any) -> Scenario:
    """`data` (plain JSON) as a `Scenario`; `ValueError` naming the field if it is not one."""
    try:
        return msgspec.convert(data, Scenario)
    except msgspec.ValidationError as exc:
        raise ValueError(f"scenario: {with_hint(str(exc), Scenario)}") from None


def _openai_error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": code, "param": None}},
        status_code=status,
    )


def _tokens(text: str) -> int:
    return len(text.split())


def latency_for(messages: Any, latency_s: float, spread: float) -> float:
    """How long the reply to a request with these `messages` is held: `latency_s`, moved by up
    to `spread` (0 to 1) of itself by a hash of the messages.

    Replies do not all arrive in step, as a real model's do not, yet whoever sent a request can
    compute how long its reply was held (the same messages, the same delay).
    """
    if spread <= 0 or latency_s <= 0:
        return latency_s
    unit = int(sha256_hex(canonical_json(messages))[:8], 16) / 0x1_0000_0000
    return latency_s * (1.0 + spread * (2.0 * unit - 1.0))


def _message_tokens(message: dict[str, Any]) -> int:
    calls = message.get("tool_calls")
    called = _tokens(canonical_json(calls).decode()) if calls else 0
    return _tokens(message.get("content") or "") + called + 3


def answer_for(body: dict[str, Any], turn: Turn | None = None) -> dict[str, Any]:
    """The deterministic completion for a valid request body: `turn`'s text or tool calls, or
    without one an echo of the last user message and a hash of all messages."""
    messages = body["messages"]
    digest = sha256_hex(canonical_json(messages))
    message: dict[str, Any]
    if turn is not None and turn.tool_calls:
        calls = [
            {
                "id": call.id or f"call_{digest[:12]}_{i}",
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": call.arguments
                    if isinstance(call.arguments, str)
                    else canonical_json(call.arguments).decode(),
                },
            }
            for i, call in enumerate(turn.tool_calls)
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
        completion = _tokens(canonical_json(calls).decode())
    else:
        if turn is not None and turn.text is not None:
            text = turn.text
        else:
            last_user = next(
                (m["content"] for m in reversed(messages) if m.get("role") == "user"), ""
            )
            text = f"echo {digest[:16]}: {last_user}".strip()
        finish = "stop"
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and _tokens(text) > max_tokens:
            text = " ".join(text.split()[:max_tokens])
            finish = "length"
        message = {"role": "assistant", "content": text}
        completion = _tokens(text)
    prompt = sum(_message_tokens(m) for m in messages)
    return {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


@dataclasses.dataclass
class CallLog:
    """What the stand-in was asked and answered, for `/_admin/stats` and tests.

    `asked` gets a line per valid request when it arrives (before any hold), so a request
    whose client was killed while it waited is logged too: `turn` (the scripted turn's name,
    None for the echo), `turn_index` (the number of assistant messages the conversation
    already holds: which model turn of an agent loop it asks for, 0 for the first; a loop
    resumed from a checkpoint starts above 0), `messages` (the request's message count),
    `digest` (a hash of its messages: equal digests, the same question asked twice) and
    `hold_s`, and `api`, the API it came by (`chat`, `responses`, `anthropic`). `answered` and
    `turns` get the completion's id and turn name per answer.
    """

    answered: list[str] = dataclasses.field(default_factory=list)
    turns: list[str | None] = dataclasses.field(default_factory=list)
    asked: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    held: Counter[str] = dataclasses.field(default_factory=Counter)  # by turn, per script

    def arrive(self, messages: list[dict[str, Any]], turn: Turn | None, api: str = "chat") -> float:
        """Log a request; return how long `turn` holds its answer (see `Turn`)."""
        hold = 0.0
        if turn is not None and turn.hold_s > 0 and self.held[turn.name] < (turn.holds or math.inf):
            self.held[turn.name] += 1
            hold = turn.hold_s
        self.asked.append(
            {
                "turn": None if turn is None else turn.name,
                "turn_index": sum(1 for m in messages if m.get("role") == "assistant"),
                "messages": len(messages),
                "digest": sha256_hex(canonical_json(messages))[:16],
                "hold_s": hold,
                "api": api,
            }
        )
        return hold

    def answer(self, completion: dict[str, Any], turn: Turn | None) -> None:
        self.answered.append(completion["id"])
        self.turns.append(None if turn is None else turn.name)


class Holds:
    """The holds under way (`Turn.hold_s`); `release` ends them all at once."""

    def __init__(self) -> None:
        self._under_way: set[anyio.CancelScope] = set()

    async def wait(self, hold_s: float, latency_s: float) -> None:
        """Hold an answer `hold_s` (or until released), then delay it `latency_s` more."""
        if hold_s > 0:
            with anyio.CancelScope() as scope:
                self._under_way.add(scope)
                try:
                    await anyio.sleep(hold_s)
                finally:
                    self._under_way.discard(scope)
        if latency_s > 0:
            await anyio.sleep(latency_s)

    async def release_route(self, _request: Request) -> Response:
        """`POST /_admin/release`: end the holds under way; how many there were."""
        released = len(self._under_way)
        for scope in self._under_way:
            scope.cancel()
        return JSONResponse({"released": released})


def _invalid_request(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "'model' is required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            return f"messages[{i}] needs a valid 'role'"
        if not isinstance(message.get("content"), str | None):
            return f"messages[{i}].content must be a string"
    return None


@dataclasses.dataclass(frozen=True)
class _Api:
    """How one of the stand-in's APIs reads a request, writes an answer and refuses."""

    name: str
    # (body, request) -> the neutral chat body; raises standin_apis.Refusal
    read: Callable[[Any, Request], dict[str, Any]]
    answer: Callable[[dict[str, Any]], dict[str, Any]]  # the chat completion -> the API's answer
    error: Callable[..., JSONResponse]  # (status, message, kind, code=None) -> an error response

    def key_matches(self, request: Request, expected: str) -> bool:
        if self.name == "anthropic":
            given, wanted = request.headers.get("x-api-key", ""), expected
        else:
            given, wanted = request.headers.get("authorization", ""), f"Bearer {expected}"
        return hmac.compare_digest(given.encode(), wanted.encode())


def _anthropic_error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(standin_apis.anthropic_error(status, kind, message), status_code=status)


def _chat_body(body: Any, _request: Request) -> dict[str, Any]:
    problem = _invalid_request(body)
    if problem is not None:
        raise standin_apis.Refusal(400, "invalid_request_error", problem)
    return dict(body)


def _neutral_body(read: Any) -> Callable[[Any, Request], dict[str, Any]]:
    def to_body(body: Any, request: Request) -> dict[str, Any]:
        neutral = (
            read(body) if read is standin_apis.read_responses else read(body, request.headers.get)
        )
        out: dict[str, Any] = {"model": neutral.model, "messages": neutral.messages}
        if neutral.max_tokens is not None:
            out["max_tokens"] = neutral.max_tokens
        return out

    return to_body


_APIS = {
    "chat": _Api("chat", _chat_body, lambda c: c, _openai_error),
    "responses": _Api(
        "responses",
        _neutral_body(standin_apis.read_responses),
        standin_apis.responses_answer,
        _openai_error,
    ),
    "anthropic": _Api(
        "anthropic",
        _neutral_body(standin_apis.read_messages),
        standin_apis.messages_answer,
        _anthropic_error,
    ),
}


def _misbehaviour(request: Request, k: Knobs, api: _Api = _APIS["chat"]) -> Response | None:
    """The error the knobs give this request, in `Knobs`'s order, in `api`'s error shape; None
    to answer it."""
    anthropic = api.name == "anthropic"
    if k.expected_key is not None and not api.key_matches(request, k.expected_key):
        if anthropic:
            return api.error(401, "invalid x-api-key", "authentication_error")
        return _openai_error(
            401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
        )
    if k.quota_exhausted:
        if anthropic:  # Anthropic's spent credit: a 400, told apart by its message
            return api.error(
                400,
                "Your credit balance is too low to access the Anthropic API. Please go to"
                " Plans & Billing to upgrade or purchase credits.",
                "invalid_request_error",
            )
        return _openai_error(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        )
    if k.fail_429 > 0:
        k.fail_429 -= 1
        if anthropic:
            response = api.error(429, "Rate limited (stand-in).", "rate_limit_error")
        else:
            response = _openai_error(
                429, "Rate limit reached (stand-in).", "requests", "rate_limit_exceeded"
            )
        response.headers["Retry-After"] = f"{k.retry_after_s:g}"
        return response
    if k.fail_500 > 0:
        k.fail_500 -= 1
        if anthropic:
            return api.error(529, "Overloaded (stand-in).", "overloaded_error")
        return _openai_error(500, "The server had an error (stand-in).", "server_error")
    return None


def create_app(knobs: Knobs | None = None, scenario: Scenario | None = None) -> Starlette:
    """The stand-in as an ASGI app; `app.state.knobs`, `app.state.calls`, `app.state.turns`,
    `app.state.asked` and `app.state.scenario` (a one-item list, replaced by the admin route)
    are live.

    POST /v1/chat/completions, /v1/responses, /v1/messages   the model, in each API's shape
    POST /_admin/knobs     {"latency_s": 0.5, "fail_429": 2, ...}  -> the knobs now
    GET  /_admin/knobs     the knobs (the expected key itself is never shown)
    POST /_admin/scenario  {"turns": [...]} (a `Scenario`) replaces the script -> the script now
    GET  /_admin/scenario  the script
    POST /_admin/release   ends the holds under way (`Turn.hold_s`): their answers go out now
    GET  /_admin/stats     {"calls": N, "by_status": {"200": n, ...}, "answered": [hash...],
                            "turns": [the turn's name, or null for an echo, per answer],
                            "asked": [a `CallLog` line per valid request, on arrival]}
    GET  /healthz          {"ok": true} once it listens
    """
    state_knobs = knobs or Knobs()
    script = [scenario or Scenario()]
    calls: Counter[str] = Counter()
    log = CallLog()
    holds = Holds()

    def serve(api: _Api) -> Any:
        async def route(request: Request) -> Response:
            calls["total"] += 1
            response = await _decide(request, state_knobs, api)
            calls[str(response.status_code)] += 1
            return response

        return route

    async def _decide(request: Request, k: Knobs, api: _Api) -> Response:
        refused = _misbehaviour(request, k, api)
        if refused is not None:
            return refused
        try:
            raw = await request.json()
        except ValueError:
            return api.error(400, "request body is not valid JSON", "invalid_request_error")
        try:
            body = api.read(raw, request)
        except standin_apis.Refusal as refusal:
            return api.error(refusal.status, refusal.message, refusal.kind)
        messages = body["messages"]
        turn = script[0].turn_for(messages)
        hold = log.arrive(messages, turn, api.name)
        await holds.wait(hold, latency_for(messages, k.latency_s, k.latency_spread))
        completion = answer_for(body, turn)
        log.answer(completion, turn)
        return JSONResponse(api.answer(completion))

    async def knobs_route(request: Request) -> Response:
        if request.method == "POST":
            try:
                changes = await request.json()
            except ValueError:
                return JSONResponse(
                    {"error": "malformed_json", "detail": "body is not JSON"}, status_code=400
                )
            problem = state_knobs.update(changes)
            if problem is not None:
                return JSONResponse({"error": "invalid_field", "detail": problem}, 400)
        return JSONResponse(state_knobs.public())

    async def scenario_route(request: Request) -> Response:
        if request.method == "POST":
            try:
                script[0] = read_scenario(await request.json())
            except ValueError as exc:  # malformed JSON is a ValueError too
                return JSONResponse({"error": "invalid_field", "detail": str(exc)}, 400)
            log.held.clear()
        return JSONResponse(msgspec.to_builtins(script[0]))

    async def stats_route(_request: Request) -> Response:
        by_status = {k: v for k, v in calls.items() if k != "total"}
        return JSONResponse(
            {
                "calls": calls["total"],
                "by_status": by_status,
                "answered": list(log.answered),
                "turns": list(log.turns),
                "asked": list(log.asked),
            }
        )

    async def healthz_route(_request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def models_route(_request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "stand-in", "object": "model"}]})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", serve(_APIS["chat"]), methods=["POST"]),
            Route("/v1/responses", serve(_APIS["responses"]), methods=["POST"]),
            Route("/v1/messages", serve(_APIS["anthropic"]), methods=["POST"]),
            Route("/v1/models", models_route, methods=["GET"]),
            Route("/healthz", healthz_route, methods=["GET"]),
            Route("/_admin/knobs", knobs_route, methods=["GET", "POST"]),
            Route("/_admin/scenario", scenario_route, methods=["GET", "POST"]),
            Route("/_admin/stats", stats_route, methods=["GET"]),
            Route("/_admin/release", holds.release_route, methods=["POST"]),
        ]
    )
    app.state.knobs = state_knobs
    app.state.calls = calls
    app.state.turns = log.turns
    app.state.asked = log.asked
    app.state.scenario = script
    return app


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m examples.standin_model",
        description="A stand-in OpenAI-compatible chat server: a test double, not a model.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--key", help="expected API key (visible in ps; prefer --key-file)")
    key.add_argument("--key-file", type=Path, help="file holding the expected API key")
    parser.add_argument("--latency", type=float, default=0.0, metavar="S")
    parser.add_argument("--latency-spread", type=float, default=0.0, metavar="F")
    parser.add_argument("--fail-429", type=int, default=0, metavar="N")
    parser.add_argument("--retry-after", type=float, default=1.0, metavar="S")
    parser.add_argument("--fail-500", type=int, default=0, metavar="N")
    parser.add_argument("--quota-exhausted", action="store_true")
    parser.add_argument(
        "--scenario", type=Path, metavar="FILE", help="a JSON scenario of scripted turns"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    expected = args.key
    if args.key_file is not None:
        try:
            expected = args.key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            print(f"standin_model: cannot read {args.key_file}: {exc.strerror}", file=sys.stderr)
            return 2
    knobs = Knobs(
        latency_s=args.latency,
        latency_spread=args.latency_spread,
        fail_429=args.fail_429,
        retry_after_s=args.retry_after,
        fail_500=args.fail_500,
        quota_exhausted=args.quota_exhausted,
        expected_key=expected or None,
    )
    for flag, value in (("--latency", args.latency), ("--retry-after", args.retry_after)):
        if not (math.isfinite(value) and value >= 0):
            print(
                f"standin_model: {flag} must be a finite number >= 0, got {value}", file=sys.stderr
            )
            return 2
    if not 0 <= args.latency_spread <= 1:
        spread = args.latency_spread
        print(f"standin_model: --latency-spread must be 0..1, got {spread}", file=sys.stderr)
        return 2
    scenario = None
    if args.scenario is not None:
        try:
            scenario = read_scenario(msgspec.json.decode(args.scenario.read_bytes()))
        except OSError as exc:
            print(f"standin_model: cannot read {args.scenario}: {exc.strerror}", file=sys.stderr)
            return 2
        except msgspec.DecodeError as exc:
            print(f"standin_model: {args.scenario} is not JSON: {exc}", file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"standin_model: {args.scenario}: {exc}", file=sys.stderr)
            return 2
    if not 0 < args.port < 65536:
        print(f"standin_model: --port must be 1..65535, got {args.port}", file=sys.stderr)
        return 2
    import uvicorn

    uvicorn.run(create_app(knobs, scenario), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
