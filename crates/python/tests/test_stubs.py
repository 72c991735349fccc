"""The package is typed: its stubs match the native module (mypy's
stubtest, as pydantic-core checks its own)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple, Union

import pytest

import settle
import settle._settle

STUBS = Path(settle.__file__).parent / "_settle.pyi"

#: The dunders a program uses (``async with``, ``async for``, ``await``):
#: documented and checked like public names.
PROTOCOL = {"__aenter__", "__aexit__", "__aiter__", "__anext__", "__await__"}

_Def = Union[ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef]


def _public(name: str) -> bool:
    return not name.startswith("_") or name in PROTOCOL


def _stub_module() -> ast.Module:
    return ast.parse(STUBS.read_text(), filename=str(STUBS))


def _stub_classes() -> Dict[str, ast.ClassDef]:
    """The stubs' public classes, by name."""
    return {
        node.name: node
        for node in _stub_module().body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    }


def _members(body: list) -> Iterator[Tuple[str, ast.stmt, Union[str, None]]]:
    """Each name a class or module body defines (functions, properties,
    annotated attributes), the statement and its docstring: a function's
    own, or the string that follows an attribute (what editors show)."""
    for at, node in enumerate(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node, ast.get_docstring(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            after = body[at + 1] if at + 1 < len(body) else None
            doc = None
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                doc = after.value.value if isinstance(after.value.value, str) else None
            yield node.target.id, node, doc


def _stub_names(body: list) -> Set[str]:
    return {name for name, _, _ in _members(body) if _public(name)}


def test_the_package_ships_py_typed_and_stubs():
    folder = Path(settle.__file__).parent
    assert (folder / "py.typed").exists()
    assert (folder / "_settle.pyi").exists()


def test_the_stubs_match_the_native_module():
    pytest.importorskip("mypy")
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "settle._settle"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_packages_python_is_clean_under_mypy_strict():
    """The package's own Python (the bridge, ``__init__``, the stubs) type-checks
    under ``mypy --strict``, as a program that uses it strictly checks it."""
    pytest.importorskip("mypy")
    # As a package found where it is installed (`-p`): a path inside
    # site-packages would make mypy take site-packages for a source root.
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "-p", "settle"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_package_says_how_it_was_built():
    """``settle.BUILD_PROFILE``, not only ``settle._settle``'s: what a
    program checks before it measures (a debug build is slower)."""
    assert settle.BUILD_PROFILE in ("release", "debug")
    assert "BUILD_PROFILE" in settle.__all__


async def test_the_calls_the_stubs_type_none_resolve_to_none(kernel):
    """``_Call[None]`` in the stubs: each resolves to ``None`` (a Rust
    ``()`` reached Python as the empty tuple), a finalized session's
    ``release`` too."""

    async def reply():
        yield "a"

    session = await kernel.register("s")
    results = {
        "hold": await session.hold("input"),
        "release": await session.release("input"),
    }
    turn = await session.turn(reply())
    results["turn.aclose"] = await turn.aclose()
    turn = await session.turn(reply())
    results["turn.__aexit__"] = await turn.__aexit__(None, None, None)
    results["cancel"] = await session.cancel()
    await session.finalized()
    results["release after the end"] = await session.release("input")
    assert results == dict.fromkeys(results)


def test_every_public_name_of_the_stubs_has_a_docstring():
    """Editors show the stubs' docstrings on hover, not the native
    module's: each public class, function, method, property and
    constant has one (and so do the protocol methods ``async with``,
    ``async for`` and ``await`` call)."""
    bare = []
    for name, node, doc in _members(_stub_module().body):
        if name.startswith("_"):
            continue
        if not (doc or "").strip():
            bare.append(name)
        if isinstance(node, ast.ClassDef):
            bare += [
                f"{name}.{member}"
                for member, _, doc in _members(node.body)
                if _public(member) and not (doc or "").strip()
            ]
    assert bare == [], f"no docstring in {STUBS.name}: {bare}"


def test_the_stubs_and_the_native_module_name_the_same_public_members():
    """Without mypy: a name the native module has and the stubs lack is
    invisible to a typed program (and undocumented in editors), one the
    stubs have and the module lacks fails at run time."""
    module = _stub_module()
    runtime = {name for name in dir(settle._settle) if not name.startswith("_")}
    _same("settle._settle", _stub_names(module.body), runtime)
    declared = next(
        node.value
        for node in module.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    )
    assert sorted(ast.literal_eval(declared)) == sorted(runtime)
    for name, node in _stub_classes().items():
        cls = getattr(settle._settle, name)
        assert inspect.isclass(cls), name
        own = {member for member in vars(cls) if _public(member)}
        _same(name, _stub_names(node.body), own)


def _same(where: str, stub: Set[str], runtime: Set[str]) -> None:
    assert stub == runtime, (
        f"{where}: not in the stubs {sorted(runtime - stub)}, not in the native module {sorted(stub - runtime)}"
    )


def test_a_task_is_generic_at_run_time_as_in_the_stubs():
    """``settle.Task[int]`` in an annotation that is evaluated (no
    ``from __future__ import annotations``), as ``asyncio.Task[int]``."""
    alias = settle.Task[int]
    assert alias.__origin__ is settle.Task and alias.__args__ == (int,)


TYPED_PROGRAM = """
import asyncio
import pathlib
from typing import List

from typing_extensions import assert_type

import settle


async def tool() -> int:
    return 1


async def main() -> None:
    kernel = await settle.Kernel.open(pathlib.Path("x.db"))
    session = await kernel.register("s")
    task = await session.spawn(tool())
    assert_type(task, settle.Task[int])
    assert_type(await task, int)
    assert_type(await task.join(), int)
    annotated: settle.Task[int] = task
    word: str = await task  # E: the task's result is an int
    messages: List[dict[str, object]] = [{"role": "user", "content": "hi"}]
    turn = await session.turn(lambda: None, input=messages)
    reader = asyncio.create_task(turn.__anext__())
    assert_type(await reader, settle.Chunk)
    print(annotated, word)
"""


def test_the_stubs_type_what_a_program_writes(tmp_path):
    """Under ``mypy --strict``: a task is typed by its coroutine's result,
    a store's path may be a ``pathlib.Path``, a turn's input any list of
    message mappings, a turn's next chunk a coroutine ``create_task``
    takes; and a wrong use is still an error."""
    pytest.importorskip("mypy")
    program = tmp_path / "typed.py"
    program.write_text(TYPED_PROGRAM)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "mypy_cache"), str(program)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    expected = [n for n, line in enumerate(TYPED_PROGRAM.splitlines(), 1) if "# E:" in line]
    assert [int(line.split(":")[1]) for line in errors] == expected, out.stdout + out.stderr
    assert 'expression has type "int"' in errors[0], errors


def test_the_examples_pass_mypy_strict(tmp_path):
    """Found from outside: the examples a team copies from failed ``mypy
    --strict`` (22 errors), and the reply's message and a resumed history
    could not go where the ``openai`` package's message type is expected
    without a cast. They type-check as shipped."""
    pytest.importorskip("mypy")
    pytest.importorskip("openai")
    pytest.importorskip("websockets")
    examples = sorted(str(p) for p in (Path(__file__).resolve().parents[3] / "examples" / "python").glob("*.py"))
    assert len(examples) >= 4, examples
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "mypy_cache"), *examples],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
