"""A stand-in for a model server, to try the examples without one: an
OpenAI-compatible `POST /v1/chat/completions` that streams a canned reply
as server-sent events, a word every `--delay` seconds. Offered tools and
not yet answered by one, it asks for the first tool instead (its string
arguments `/etc/hostname`, its numbers 0.1), so the tool loop runs too.
Standard library only; not a model, and not for a network.

    python examples/python/stand_in_model.py &            # http://127.0.0.1:8080/v1
    python examples/python/scan.py --base-url http://127.0.0.1:8080/v1
"""

import argparse, json, time
from typing import Any, Dict, List
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = "A stand-in model's reply, streamed a word at a time so that a turn is mid-stream for a while."
FILL = {"string": "/etc/hostname", "number": 0.1, "integer": 1, "boolean": True}


def deltas(request: Dict[str, Any]) -> List[Dict[str, Any]]:
    """What to stream for a request: the first tool's call, or the reply's words."""
    messages, tools = request.get("messages") or [], request.get("tools") or []
    answered = bool(messages) and messages[-1].get("role") == "tool"
    if tools and not answered:
        function = tools[0].get("function", {})
        properties = function.get("parameters", {}).get("properties", {})
        arguments = json.dumps({k: FILL.get(v.get("type"), "") for k, v in properties.items()})
        call = {"index": 0, "id": "call_0", "type": "function", "function": {"name": function.get("name", ""), "arguments": arguments}}
        return [{"tool_calls": [call]}]
    text = REPLY if not answered else f"The tool said: {str(messages[-1].get('content', ''))[:80].strip()}"
    return [{"content": word} for word in text.replace(" ", "\0 ").split("\0")]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay = 0.1

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self.send_error(404, "only POST /v1/chat/completions is served")
            return
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        except ValueError:
            self.send_error(400, "the body is not JSON")
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        pieces = deltas(request)
        finish = "tool_calls" if "tool_calls" in pieces[0] else "stop"
        try:
            for n, delta in enumerate(pieces):
                last = n == len(pieces) - 1
                self.event({"index": 0, "delta": delta, "finish_reason": finish if last else None})
                time.sleep(0 if last else self.delay)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client closed the stream: a cancelled turn
        self.close_connection = True

    def event(self, choice: Dict[str, Any]) -> None:
        chunk = {"id": "stand-in", "object": "chat.completion.chunk", "created": int(time.time()), "model": "stand-in", "choices": [choice]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the standard library's name)
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--delay", type=float, default=0.1, help="seconds between words")
    args = parser.parse_args()
    Handler.delay = args.delay
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"serving http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
