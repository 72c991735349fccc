"""A client of a fleet of `settle serve` processes that follows a redeploy.

    pip install websockets
    python examples/python/fleet_client.py ws://127.0.0.1:8765/ws ws://127.0.0.1:8766/ws

It creates a session on the first process and runs a turn; then it stays
connected. When that process shuts down (`server.shutdown` with
`handoff: true`, then the connection closes), it connects to another one,
`session.attach`es the session (following an `elsewhere` answer to the
process it names), runs a second turn with the whole conversation behind
it, and closes the session.
"""
import asyncio, json, sys
from typing import Any, Dict, Optional, Tuple
import websockets
from websockets.asyncio.client import ClientConnection

NODES = sys.argv[1:] or ["ws://127.0.0.1:8765/ws"]


async def rpc(ws: ClientConnection, n: int, method: str, **params: Any) -> Dict[str, Any]:
    await ws.send(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}))
    while True:
        msg: Dict[str, Any] = json.loads(await ws.recv())
        if msg.get("id") == n:
            return msg


async def turn(ws: ClientConnection, session: int, prompt: str) -> None:
    await rpc(ws, 2, "turn.start", id=session, prompt=prompt)
    async for frame in ws:
        msg = json.loads(frame)
        if msg.get("method") == "turn.chunk":
            print(msg["params"]["text"], end="", flush=True)
        elif msg.get("method") == "turn.ended":
            print(f" [{msg['params']['outcome']}]", flush=True)
            return


async def attach(session: int, avoid: str) -> Tuple[ClientConnection, str]:
    """Connects to a process other than `avoid` and attaches `session` there."""
    urls = [u for u in NODES if u != avoid] or NODES
    url = urls[0]
    while True:
        try:
            ws = await websockets.connect(url)
        except OSError:  # not up (yet): try the next one
            url = urls[(urls.index(url) + 1) % len(urls)] if url in urls else urls[0]
            await asyncio.sleep(0.1)
            continue
        answer = await rpc(ws, 1, "session.attach", id=session)
        if "error" not in answer:
            return ws, url
        await ws.close()
        if answer["error"]["data"]["kind"] != "elsewhere":
            raise RuntimeError(answer["error"])
        # Owned by a live process: go there. Not released yet: wait a little.
        owner: Optional[str] = answer["error"]["data"]["owner"]
        url = owner or url
        await asyncio.sleep(0.05)


async def main() -> None:
    url = NODES[0]
    ws = await websockets.connect(url)
    session: int = (await rpc(ws, 1, "session.create", name="py"))["result"]["id"]
    await turn(ws, session, "first")
    print("ready", flush=True)
    # Connected until the process goes: a redeploy hands the session off.
    async for frame in ws:
        msg = json.loads(frame)
        if msg.get("method") == "server.shutdown":
            print(f"handoff: {msg['params'].get('handoff')}", flush=True)
    ws, url = await attach(session, avoid=url)
    await turn(ws, session, "second")
    print((await rpc(ws, 3, "session.close", id=session))["result"]["end_reason"], flush=True)
    await ws.close()


asyncio.run(main())
