"""A tool-calling agent under settle: it streams from an OpenAI-compatible
server with the `openai` package, runs the model's tool calls as settle
tasks of its session, sends their results back and loops until the model
answers in text. Killed mid-loop, it goes on where it was with --resume.

    pip install ./crates/python openai
    python examples/python/tool_loop.py --base-url http://127.0.0.1:8080/v1 "What is in /etc/hostname?"
    settle recover && python examples/python/tool_loop.py --resume ID   # after a kill -9
"""

import argparse, asyncio, json, os
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Sequence
import openai, settle
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam


async def read_file(path: str) -> str:
    with open(path) as file:  # its first 4 KiB
        return file.read(4096)


async def sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return f"slept {seconds} s"


TOOLS: Dict[str, Callable[..., Awaitable[str]]] = {"read_file": read_file, "sleep": sleep}
SCHEMAS: List[ChatCompletionToolParam] = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
           {"type": "function", "function": {"name": "sleep", "parameters": {"type": "object", "properties": {"seconds": {"type": "number"}}}}}]


async def call(session: settle.Session, tool: Mapping[str, Any]) -> str:  # a tool's failure is the model's to read
    print(f"[tool] {tool['name']} {tool['arguments']}", flush=True)
    try:
        return str(await (await session.spawn(TOOLS[tool["name"]](**json.loads(tool["arguments"] or "{}")))))
    except settle.Error:
        raise  # the session's own end (cancelled, closed, shutting down): the loop's too
    except Exception as error:
        return f"error: {type(error).__name__}: {error}"


async def agent(session: settle.Session, model: openai.AsyncOpenAI, name: str,
                messages: List[ChatCompletionMessageParam], pending: Sequence[Mapping[str, Any]] = ()) -> str:
    while True:
        results = await asyncio.gather(*(call(session, tool) for tool in pending))  # at once
        messages += [{"role": "tool", "content": r, "tool_call_id": t["id"]} for t, r in zip(pending, results)]
        sent = list(messages)
        stream = lambda: model.chat.completions.create(model=name, messages=sent, tools=SCHEMAS, stream=True)
        async with await session.turn(stream, input=sent) as turn:
            async for chunk in turn:  # stored before it is seen (G7)
                print(chunk.text or "", end="", flush=True)
        if turn.outcome != "completed":
            raise RuntimeError(f"turn {turn.no}: {turn.outcome} {turn.error or ''}")
        reply, pending = turn.reply(), turn.tool_calls()
        if not pending:
            return reply["text"]
        messages.append(reply["message"])  # the reply and its tool calls, as the model is sent them back


async def main(args: argparse.Namespace) -> None:
    model = openai.AsyncOpenAI(base_url=args.base_url, api_key=os.environ.get("SETTLE_API_KEY", "unused"))
    async with await settle.Kernel.open(args.db) as kernel:
        kernel.install_signal_handlers()  # Ctrl-C: graceful shutdown (G9)
        if args.resume is not None:  # a finalized session (`settle recover` ends a crashed one)
            resumed = await kernel.resume(args.resume, "agent")
            session, messages, pending = resumed.session, resumed.history, resumed.pending_tool_calls
        else:
            messages = [{"role": "user", "content": args.prompt}]
            session, pending = await kernel.register("agent"), []
        print(f"[session {session.id}]", flush=True)
        print("\n[answer]", await agent(session, model, args.model, messages, pending))
        await session.finish()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default="What is in /etc/hostname?")
    parser.add_argument("--base-url", default=os.environ.get("SETTLE_BASE_URL", "http://127.0.0.1:8080/v1"))
    parser.add_argument("--model", default=os.environ.get("SETTLE_MODEL", "local"))
    parser.add_argument("--db", default="settle.db")
    parser.add_argument("--resume", type=int, metavar="ID", help="continue this finalized session")
    asyncio.run(main(parser.parse_args()))
