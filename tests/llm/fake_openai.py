"""A real HTTP server speaking the OpenAI Chat Completions API, with scripted answers.

It listens on 127.0.0.1 (a free port), serves GET /v1/models and POST /v1/chat/completions,
and decides which agent is asking from the system prompt ("You are the Bottleneck
Analysis agent ..."). By default it answers like a sensible model: the analysis ranks the
performance model's candidate moves from the prompt, generation applies the first
suggestions to the current configuration, failure analysis reads the fenced log. A test
replaces any answer with a `script(call) -> Reply | str | None` (None: the default answer),
so it can send malformed text, 429s, 500s or nothing at all.

Used by tests/llm and by benchmarks/llm_tokens.py; it is a test double, not a product part.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from optico.llm.parsing import coerce_value, parse_changes
from optico.strategy import PAPER_NAMES, canonical_field, display_value

ROLES = {"bottleneck analysis": "analysis", "strategy generation": "generation", "failure analysis": "failure"}


@dataclass
class Reply:
    """What the server sends back for one request."""

    content: str | None = None  # the assistant's text (None: the default answer)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # error message for a non-200 status
    delay_s: float = 0.0  # sleep before answering (a hanging server)
    usage: bool = True
    chunk_delay_s: float = 0.0  # streamed: sleep between chunks (a slow generation)
    cut_after: int | None = None  # streamed: drop the connection after this many chunks (a dying server)
    model: str | None = None  # the model the answer says answered (None: the one asked for)


@dataclass
class Call:
    """One request as the script sees it."""

    role: str  # analysis | generation | failure | other
    n: int  # this role's call number, from 1
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def messages(self) -> list[dict[str, str]]:
        return self.body.get("messages", [])

    @property
    def system(self) -> str:
        return next((m["content"] for m in self.messages if m["role"] == "system"), "")

    @property
    def user(self) -> str:
        return next((m["content"] for m in self.messages if m["role"] == "user"), "")

    @property
    def mode(self) -> str:
        rf = self.body.get("response_format") or {}
        if rf.get("type") == "json_object" and "schema" in rf:
            return "json_object_schema"  # llama.cpp's own schema form
        return rf.get("type", "text")

    @property
    def is_reask(self) -> bool:
        return any(m["role"] == "assistant" for m in self.messages)

    @property
    def last_user(self) -> str:
        return [m["content"] for m in self.messages if m["role"] == "user"][-1]


Script = Callable[[Call], "Reply | str | None"]


def role_of(system: str) -> str:
    m = re.search(r"You are the ([A-Za-z]+ [A-Za-z]+) agent", system)
    return ROLES.get(m.group(1).lower(), "other") if m else "other"


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


# -- the default, sensible answers ---------------------------------------------------------------

def _section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}[^\n]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else ""


def current_config(user: str) -> dict[str, Any]:
    block = _section(user, "Current configuration")
    m = re.search(r"```json\n(.*?)\n```", block, re.S)
    return json.loads(m.group(1)) if m else {}


def tunables(user: str) -> list[str]:
    return re.findall(r"^- \S+ \((\w+)\):", _section(user, "Search space"), re.M)


def candidate_moves(user: str) -> list[list[tuple[str, str, str]]]:
    """Each numbered "Change ..." line of the analysis prompt's candidates (or generation's suggestions);
    in the LLM-led mode, which shows no candidates, one-parameter moves to the next allowed value."""
    body = _section(user, "Candidate moves") or _section(user, "Bottleneck analysis")
    moves = [c for line in body.splitlines() if re.match(r"^\d+\. Change", line) for c in [parse_changes(line)] if c]
    if moves or _section(user, "Bottleneck analysis"):
        return moves
    current = current_config(user)
    for line in _section(user, "Search space").splitlines():
        m = re.match(r"^- (\S+) \((\w+)\): (.*)$", line)
        if not m or m.group(2) not in current:
            continue
        now = display_value(m.group(2), current[m.group(2)])
        values = m.group(3).split(", ")
        if now not in values:
            continue
        at = values.index(now)  # the next allowed value up (more parallelism, more recompute), else down
        other = values[at + 1] if at + 1 < len(values) else values[at - 1] if at else None
        if other is not None:
            moves.append([(m.group(1), now, other)])
    return moves


def analysis_answer(call: Call, k: int = 6) -> str:
    moves = candidate_moves(call.user)[:k]
    if call.mode != "text":
        return json.dumps({
            "think": "Step 1: health from the latest measurements. Step 2: the model's best moves.",
            "health": "PERFORMANCE_TUNE", "health_reason": "GPU util and memory are in range",
            "bottleneck": "communication",
            "suggestions": [{"changes": [{"param": n, "from": a, "to": b} for n, a, b in move],
                             "reason": "the performance model ranks it high", "expected_effect": "MFU up",
                             "kind": "standard"} for move in moves]})
    lines = ["<think>Health first, then the bottleneck, then the model's candidates.</think>",
             "HEALTH: PERFORMANCE_TUNE", "HEALTH_REASON: memory and utilisation in range",
             "BOTTLENECK: communication", "SUGGESTIONS:"]
    for i, move in enumerate(moves, start=1):
        parts = [f"{n} from {a} to {b}" for n, a, b in move]
        lines.append(f"{i}. Change {' and '.join(parts)}. Reason: ranked high by the model. Expected: MFU up. "
                     f"Kind: standard")
    return "\n".join(lines)


def _configs(call: Call, k: int) -> list[dict[str, Any]]:
    current, fields = current_config(call.user), tunables(call.user)
    out = []
    for move in candidate_moves(call.user)[:k]:
        config = {f: current.get(f) for f in fields}
        for name, _, new in move:
            f = canonical_field(name)
            config[f] = coerce_value(f, new)
        if config.get("tensor_model_parallel_size") == 1 and "sequence_parallel" in config:
            config["sequence_parallel"] = False
        out.append(config)
    return out


def generation_answer(call: Call, k: int = 3) -> str:
    # asked again (the validator refused the first proposals): the next suggestions of the analysis
    configs = _configs(call, 2 * k)[k:] if call.is_reask else _configs(call, k)
    if call.mode != "text":
        return json.dumps({"think": "apply the ranked suggestions in order",
                           "proposals": [{"config": c, "justification": f"suggestion {i + 1} of the analysis",
                                          "expected_impact": "MFU up", "confidence": 80 - 10 * i}
                                         for i, c in enumerate(configs)]})
    blocks = ["<think>apply the suggestions</think>"]
    for i, c in enumerate(configs, start=1):
        blocks.append(f"PROPOSAL {i}")
        blocks += [f"{PAPER_NAMES.get(f, f)}: {display_value(f, v)}" for f, v in c.items()]
        blocks += [f"JUSTIFICATION: suggestion {i} of the analysis", "EXPECTED_IMPACT: MFU up",
                   f"(Confidence: {80 - 10 * i})", ""]
    return "\n".join(blocks)


def failure_line(call: Call) -> tuple[str, str, list[str], int, bool]:
    log = _section(call.user, "Log excerpt")
    failed = _section(call.user, "The failed configuration")
    mbs = re.search(r"MICRO_BATCH_SIZE=(\d+)", failed)
    pp = re.search(r"\bPP=(\d+)", failed)
    if re.search(r"out of memory", log, re.I):
        return (f"MICRO_BATCH_SIZE {mbs.group(1) if mbs else '?'} caused CUDA OutOfMemoryError (Confidence: 90)",
                "oom", ["MICRO_BATCH_SIZE"], 90, False)
    if re.search(r"AssertionError|divisible", log):
        return (f"PP {pp.group(1) if pp else '?'} caused invalid configuration (Confidence: 85)", "invalid_config",
                ["PP"], 85, False)
    if re.search(r"Watchdog|timeout|hang|no output", log, re.I):
        return ("NCCL collective timeout. No parameter issue. RETRY (Confidence: 60)", "comm_timeout", [], 60, True)
    return "Potential underlying issue: unrecognised error (Confidence: 30)", "unknown", [], 30, False


def failure_answer(call: Call) -> str:
    line, category, params, confidence, retry = failure_line(call)
    if call.mode != "text":
        return json.dumps({"think": "the first error decides", "summary": line, "category": category,
                           "params": params, "confidence": confidence, "retry": retry})
    return f"<think>The first error in the log decides.</think>\n{line}"


def default_answer(call: Call) -> str:
    if call.role == "analysis":
        return analysis_answer(call)
    if call.role == "generation":
        return generation_answer(call)
    if call.role == "failure":
        return failure_answer(call)
    return json.dumps({"ok": True}) if call.mode != "text" else "ok"


# -- the server ----------------------------------------------------------------------------------

class FakeOpenAI:
    """`with FakeOpenAI(script) as server: ... server.url` (the base URL, ending in /v1)."""

    def __init__(self, script: Script | None = None, *, formats: tuple[str, ...] = ("json_schema", "json_object"),
                 model: str = "fake-model", require_key: str | None = None, stream_usage: bool = True,
                 format_status: int = 400):
        self.script, self.formats, self.model, self.require_key = script, formats, model, require_key
        self.stream_usage = stream_usage  # False: like llama-cpp-python, no usage chunk in streams
        self.format_status = format_status  # llama-cpp-python refuses json_schema with a 500
        self.calls: list[Call] = []
        self.times: list[float] = []
        self.streams: list[dict[str, Any]] = []  # per streamed answer: chunks sent, whether the client left
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def by_role(self, role: str) -> list[Call]:
        return [c for c in self.calls if c.role == role]

    def __enter__(self) -> FakeOpenAI:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model", "created": 0,
                                                                 "owned_by": "optico-tests"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                status, payload, headers, reply = server.respond(body, dict(self.headers))
                if status == 200 and body.get("stream"):
                    self._stream(payload, reply, body)
                else:
                    self._send(status, payload, headers)

            def _stream(self, payload: dict[str, Any], reply: Reply, body: dict[str, Any]) -> None:
                """Server-sent events as OpenAI sends them: a role delta, content deltas, the finish
                reason, a usage chunk when asked for (and the server gives one), [DONE]."""
                text = payload["choices"][0]["message"]["content"]
                base = {k: payload[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
                pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
                events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                "finish_reason": None}]}]
                events += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
                           for p in pieces]
                events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                wants_usage = (body.get("stream_options") or {}).get("include_usage")
                if wants_usage and server.stream_usage and "usage" in payload:
                    events.append({**base, "choices": [], "usage": payload["usage"]})
                record = {"chunks": 0, "left": False, "cut": False}
                server.streams.append(record)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for i, event in enumerate(events):
                        if reply.cut_after is not None and i >= reply.cut_after:
                            record["cut"] = True
                            self.close_connection = True
                            return
                        if reply.chunk_delay_s and i:
                            time.sleep(reply.chunk_delay_s)
                        self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                        self.wfile.flush()
                        record["chunks"] += 1
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    record["left"] = True  # the client closed the stream: stop generating
                self.close_connection = True

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def respond(self, body: dict[str, Any], headers: dict[str, str]
                ) -> tuple[int, dict[str, Any], dict[str, str], Reply]:
        system = next((m["content"] for m in body.get("messages", []) if m.get("role") == "system"), "")
        role = role_of(system)
        with self._lock:
            call = Call(role=role, n=len(self.by_role(role)) + 1, body=body, headers=headers)
            self.calls.append(call)
            self.times.append(time.monotonic())
        auth = headers.get("Authorization") or headers.get("authorization") or ""
        if self.require_key is not None and auth != f"Bearer {self.require_key}":
            # Echo the key back, as a careless server might: the client must redact it.
            return 401, {"error": {"message": f"Incorrect API key provided: {auth.removeprefix('Bearer ')}",
                                   "type": "invalid_request_error"}}, {}, Reply()
        if call.mode != "text" and call.mode not in self.formats:
            return self.format_status, {"error": {"message": f"response_format type {call.mode!r} is not supported",
                                                  "type": "invalid_request_error", "param": "response_format"}}, {}, \
                Reply()
        reply = self.script(call) if self.script else None
        if reply is None or isinstance(reply, str):
            reply = Reply(content=reply)
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if reply.status != 200:
            return reply.status, {"error": {"message": reply.error or f"status {reply.status}",
                                            "type": "server_error"}}, reply.headers, reply
        text = reply.content if reply.content is not None else default_answer(call)
        prompt = sum(tokens(m.get("content") or "") for m in body.get("messages", []))
        payload: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.calls)}", "object": "chat.completion", "created": int(time.time()),
            "model": reply.model or body.get("model", self.model),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
        if reply.usage:
            payload["usage"] = {"prompt_tokens": prompt, "completion_tokens": tokens(text),
                                "total_tokens": prompt + tokens(text)}
        return 200, payload, reply.headers, reply
