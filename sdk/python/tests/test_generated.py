"""The asyncio client is generated from the sync one (no cluster): the committed ``aio.py`` is exactly what
``scripts/gen_aio.py`` makes of ``client.py``, and the generator's rules do what its docstring says."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest

import orchard_env
from orchard_env import AsyncProcess, AsyncRolloutGroup, AsyncSandbox, AsyncSandboxClient, AsyncSession

ROOT = Path(__file__).resolve().parent.parent


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_aio", ROOT / "scripts" / "gen_aio.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_aio"] = module
    spec.loader.exec_module(module)
    return module


gen = generator()
CLIENT = (ROOT / "src" / "orchard_env" / "client.py").read_text()


def test_the_committed_aio_py_is_what_the_generator_makes() -> None:
    committed = (ROOT / "src" / "orchard_env" / "aio.py").read_text()
    generated = gen.generate()
    diff = "".join(difflib.unified_diff(
        committed.splitlines(keepends=True), generated.splitlines(keepends=True), "aio.py (committed)", "aio.py (generated)"))
    assert committed == generated, f"aio.py is stale or was edited by hand: run `make sdk-aio`\n{diff}"


def test_the_package_imports_the_generated_module() -> None:
    assert Path(orchard_env.aio.__file__).resolve() == (ROOT / "src" / "orchard_env" / "aio.py").resolve()


@pytest.mark.parametrize("cls", [AsyncSandboxClient, AsyncSandbox, AsyncProcess, AsyncSession, AsyncRolloutGroup])
def test_public_signatures_are_static(cls: type) -> None:
    """Type checkers and IDEs read the methods as written: no ``*args, **kwargs`` wrappers."""
    for name, member in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_"):
            continue
        kinds = [p.kind for p in inspect.signature(member).parameters.values()]
        assert inspect.Parameter.VAR_POSITIONAL not in kinds, f"{cls.__name__}.{name}"
        assert member.__module__ in {"orchard_env.aio", "orchard_env._async_driver", "orchard_env._core.sandbox"}, name


def translate(methods: str) -> str:
    """The async twin of a sync class with ``methods`` (added to client.py's text, as a contributor would)."""
    source = CLIENT.replace("\n\n__all__", f"\n\nclass Sandbox2(Sandbox):\n{methods}\n\n__all__", 1)
    generated = gen.generate(source)
    ast.parse(generated)
    return generated.split("class Sandbox2(AsyncSandbox):\n", 1)[1].split("\n\n__all__", 1)[0]


def test_a_new_method_is_written_once() -> None:
    twin = translate('''
    def set_timeout(self, seconds: int, *, check: bool = False) -> dict[str, Any]:
        """Sets the sandbox's TTL to ``seconds`` from now; in its ``with`` block, see :meth:`Sandbox.close`."""
        return self._run(self._heartbeat_plan())

    def describe(self) -> str:
        """Makes no request."""
        return repr(self)

    def uses_others(self) -> int:
        """Awaits the class's own async methods, parenthesised where the result is used further."""
        return len(self.set_timeout(1).keys()) + len(self.describe())
''')
    assert "    async def set_timeout(self, seconds: int, *, check: bool = False) -> dict[str, Any]:" in twin
    assert "return await self._run(self._heartbeat_plan())" in twin
    assert "in its ``async with`` block, see :meth:`AsyncSandbox.close`" in " ".join(twin.split())
    assert "    def describe(self) -> str:" in twin and "return repr(self)" in twin
    assert "    async def uses_others(self) -> int:" in twin
    assert "return len((await self.set_timeout(1)).keys()) + len(self.describe())" in twin


def test_an_await_the_rules_cannot_place_is_an_error() -> None:
    with pytest.raises(gen.GenerationError, match="inside a lambda"):
        translate('''
    def later(self) -> Any:
        """Cannot be awaited inside a lambda."""
        return lambda: self._run(self._heartbeat_plan())
''')


def test_a_stale_rule_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(gen.DOCSTRINGS, ("Sandbox", "refresh"), [("no such text", "anything")])
    with pytest.raises(gen.GenerationError, match="no such text"):
        gen.generate()
    monkeypatch.delitem(gen.DOCSTRINGS, ("Sandbox", "refresh"))
    monkeypatch.setattr(gen, "DOC_RULES", [*gen.DOC_RULES, (r"\bnever written anywhere\b", "x")])
    with pytest.raises(gen.GenerationError, match="stale entries"):
        gen.generate()


def test_a_method_named_as_an_httpx_one_keeps_its_name() -> None:
    twin = translate('''
    def read(self, path: str) -> bytes:
        """Defines ``read`` (as Session.read does) and calls httpx's."""
        response = self._run(self._download_plan(path))
        return response.read()
''')
    assert "    async def read(self, path: str) -> bytes:" in twin, twin
    assert "return await response.aread()" in twin, twin
