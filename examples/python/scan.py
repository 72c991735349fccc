"""A strix-shaped scan under settle: a root agent, two children streaming
from an OpenAI-compatible server with the `openai` package, and a tool
coroutine. The root finishes while a child is still mid-turn: settle
cancels that child, closes its stream and finalizes it before the root (G1).

    pip install ./crates/python openai
    python examples/python/scan.py --base-url http://127.0.0.1:8080/v1 --model local
    settle sessions --tree            # what it left in settle.db
"""

import argparse, asyncio, os
from typing import List
import openai, settle
from openai.types.chat import ChatCompletionMessageParam


async def port_scan(host: str) -> str:  # a tool: a subprocess, cancelled with its session
    proc = await asyncio.create_subprocess_exec("echo", f"{host}: 22/tcp open", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode().strip()


async def agent(session: settle.Session, model: openai.AsyncOpenAI, name: str, prompt: str) -> None:
    messages: List[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    stream = lambda: model.chat.completions.create(model=name, messages=messages, stream=True)
    async with await session.turn(stream, input=messages) as turn:
        async for chunk in turn:  # each chunk is stored before it is seen (G7)
            print(f"[{session.name}] {chunk.text or chunk.kind}")
    print(f"[{session.name}] turn {turn.no}: {turn.outcome}")


async def main(args: argparse.Namespace) -> None:
    model = openai.AsyncOpenAI(base_url=args.base_url, api_key=os.environ.get("SETTLE_API_KEY", "unused"))
    async with await settle.Kernel.open(args.db, settle_timeout=1.0, drain_timeout=5.0) as kernel:
        kernel.install_signal_handlers()  # Ctrl-C: graceful shutdown (G9); twice: no drain
        root = await kernel.register("root")
        recon, web = await root.child("recon"), await root.child("web")
        tool = await recon.spawn(port_scan("10.0.0.1"))
        await agent(recon, model, args.model, f"Plan a scan of {await tool}.")
        slow = asyncio.create_task(agent(web, model, args.model, "Crawl the site."))
        await asyncio.sleep(args.web_time)
        print("root:", await root.finish())  # web is cancelled and finalized first (G1)
        await slow
        print("web:", await web.finalized())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("SETTLE_BASE_URL", "http://127.0.0.1:8080/v1"))
    parser.add_argument("--model", default=os.environ.get("SETTLE_MODEL", "local"))
    parser.add_argument("--db", default="settle.db")
    parser.add_argument("--web-time", type=float, default=0.5, help="seconds before the root finishes")
    asyncio.run(main(parser.parse_args()))
