"""A scripted OpenAI-compatible chat endpoint on 127.0.0.1, for tests and offline demos of the agent loop.

Real HTTP, so the real `openai` client library talks to it. Each request is answered by the next step of the
script: a function of the request body (so a step can read the tool result the agent sent) returning the
assistant message. Every request body is kept in `requests` for assertions.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Step = Callable[[dict[str, Any]], dict[str, Any]]


def say(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def call_run_code(code: str, **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
        "function": {"name": "run_code", "arguments": json.dumps({"code": code, **arguments})}}]}


def last_message(request: dict[str, Any], role: str) -> str:
    return next((m.get("content") or "" for m in reversed(request["messages"]) if m["role"] == role), "")


class ScriptedChatServer:
    def __init__(self, steps: list[Step], model: str = "scripted", tokens_per_reply: int | None = None):
        self.steps, self.model, self.tokens_per_reply = list(steps), model, tokens_per_reply
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedChatServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            if not self.steps:
                return 500, {"error": {"message": "the script has no more steps", "type": "server_error"}}
            step = self.steps.pop(0)
        message = step(body)
        prompt_chars = sum(len(json.dumps(m)) for m in body.get("messages", []))
        completion = self.tokens_per_reply or len(json.dumps(message)) // 4 + 1
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": completion,
                      "total_tokens": prompt_chars // 4 + completion}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                self._send(*server._answer(body))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass  # quiet: tests assert on `requests`, not on access logs

        return Handler
