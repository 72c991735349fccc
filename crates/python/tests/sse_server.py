"""A local OpenAI-compatible server: ``POST /v1/chat/completions`` answered
with server-sent events, one chunk every ``interval`` seconds, a record of
each request's body, and of when each connection was closed by the client.

``chunks`` is every request's answer; ``replies`` answers the first request
with its first list of chunks, the second with its second, and so on (the
last one again after that): a model that asks for tools, then answers."""

from __future__ import annotations

import asyncio
import json
from typing import List, Optional


class SseServer:
    def __init__(
        self,
        *,
        chunks: Optional[List[dict]] = None,
        replies: Optional[List[List[dict]]] = None,
        interval: float = 0.05,
        forever: bool = False,
        headers_delay: float = 0.0,
    ) -> None:
        self.chunks = chunks if chunks is not None else [
            {"choices": [{"index": 0, "delta": {"content": word}}]} for word in ["Hello", ",", " world"]
        ]
        self.replies = replies
        #: The JSON body of each request, in the order they came.
        self.bodies: List[dict] = []
        self.interval = interval
        self.forever = forever
        self.headers_delay = headers_delay
        self.requests = 0
        self.closed_at: List[float] = []
        self.server: Optional[asyncio.AbstractServer] = None

    @property
    def base_url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aenter__(self) -> "SseServer":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode().split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            body = await reader.readexactly(length)
            self.bodies.append(json.loads(body) if body else {})
            self.requests += 1
            chunks = self.chunks
            if self.replies:
                chunks = self.replies[min(self.requests, len(self.replies)) - 1]
            if self.headers_delay:
                eof = asyncio.ensure_future(reader.read(1))
                done, _ = await asyncio.wait({eof}, timeout=self.headers_delay)
                if done:
                    self.closed_at.append(loop.time())
                    return
                eof.cancel()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"cache-control: no-cache\r\nconnection: close\r\n\r\n"
            )
            n = 0
            while True:
                if n < len(chunks):
                    chunk = chunks[n]
                elif self.forever:
                    chunk = {"choices": [{"index": 0, "delta": {"content": f" more {n}"}}]}
                else:
                    break
                body = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "local", **chunk}
                writer.write(f"data: {json.dumps(body)}\n\n".encode())
                await writer.drain()
                n += 1
                # A closed connection shows as EOF on the reading side.
                try:
                    got = await asyncio.wait_for(reader.read(1), self.interval)
                    if got == b"":
                        self.closed_at.append(loop.time())
                        return
                except asyncio.TimeoutError:
                    pass
            # As servers do: the last chunk says why the reply ended.
            if not any(c.get("choices") and c["choices"][0].get("finish_reason") for c in chunks):
                called = any(c.get("choices") and "tool_calls" in c["choices"][0].get("delta", {}) for c in chunks)
                finish = {"index": 0, "delta": {}, "finish_reason": "tool_calls" if called else "stop"}
                body = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "local", "choices": [finish]}
                writer.write(f"data: {json.dumps(body)}\n\n".encode())
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed_at.append(loop.time())
        finally:
            writer.close()
