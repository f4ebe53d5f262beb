#!/usr/bin/env python3
"""Generates the asyncio client (``src/orchard_env/aio.py``) from the sync one (``src/orchard_env/client.py``).

``client.py`` is the one source of the public surface: every public method is written there once, as a
sync method that runs the core's plan with the sync driver. This script derives its async twin, by rule,
from the syntax tree of ``client.py`` (positions only: the text, comments and layout are kept):

* the driver: ``client.py`` imports ``_sync_driver``, ``aio.py`` imports ``_async_driver`` (same names);
* a call is awaited when it calls, by name, a coroutine function of ``_async_driver.py`` (read from that
  file: ``_run``, ``write_blocks``, ``Heartbeats.stop``...), ``self.<a method this script makes async>``
  or httpx's ``read`` (renamed ``aread``); ``await`` is parenthesised where the call's result is used
  further (``(await x).y``);
* a method becomes ``async def`` when its body awaits (or iterates or enters asynchronously, below),
  as do ``__enter__``/``__exit__`` (renamed ``__aenter__``/``__aexit__``) and the ``@overload`` stubs
  of an async method; the others (``rollout_group``, ``create``, ``__init__``...) stay plain functions.
  An awaited call inside a lambda, a comprehension or a nested function is an error;
* ``for`` over ``iter_lines``/``iter_bytes`` (renamed ``aiter_lines``/``aiter_bytes``) or over an async
  generator of the driver becomes ``async for``; ``with contextlib.closing(x)`` becomes ``async with
  contextlib.aclosing(x)``;
* names: ``SandboxClient``, ``Sandbox``, ``Process``, ``Session``, ``RolloutGroup`` (in code, ``__all__``
  and reST roles of docstrings: ``:class:`Process```) get the ``Async`` prefix, ``Iterator`` becomes
  ``AsyncIterator`` (see ``RENAMES``); httpx's and contextlib's names (``read``...) are renamed where
  called, not where ``client.py`` defines a method of that name (``Session.read``);
* docstrings: the per-member rewrites of ``DOCSTRINGS`` (where the behaviour really differs), then the
  general ``DOC_RULES`` (``with`` -> ``async with``, thread -> task...); a paragraph made too long is
  re-wrapped. A rule or rewrite that no longer matches anything is an error, so the tables cannot go
  stale;
* ``ANNOTATIONS``: the annotations that differ (``create`` and ``session`` answer an awaitable that is
  also an async context manager; ``drive`` takes coroutine functions), with the imports they need.

    python sdk/python/scripts/gen_aio.py           # writes aio.py (also: make sdk-aio)
    python sdk/python/scripts/gen_aio.py --check   # exit status 1 and a diff when aio.py is stale

``tests/test_generated.py`` fails while the committed ``aio.py`` differs from what this script makes, and
``tests/test_parity.py`` compares the two clients' signatures and docstrings. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import re
import sys
import textwrap
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "orchard_env"
SOURCE = PACKAGE / "client.py"
TARGET = PACKAGE / "aio.py"
DRIVER = PACKAGE / "_async_driver.py"

#: The public classes and their async names.
CLASSES = {
    "SandboxClient": "AsyncSandboxClient",
    "Sandbox": "AsyncSandbox",
    "Process": "AsyncProcess",
    "Session": "AsyncSession",
    "RolloutGroup": "AsyncRolloutGroup",
    "Snapshot": "AsyncSnapshot",
}

#: Identifiers renamed everywhere in the code (not inside strings or comments).
RENAMES = {
    **CLASSES,
    "_sync_driver": "_async_driver",
    "Iterator": "AsyncIterator",
    "__enter__": "__aenter__",
    "__exit__": "__aexit__",
    # httpx.Response and contextlib: the sync name and its async twin.
    "read": "aread",
    "iter_lines": "aiter_lines",
    "iter_bytes": "aiter_bytes",
    "closing": "aclosing",
}
#: Of ``RENAMES``, the names renamed only where used: a method ``client.py`` defines with one of these
#: names keeps it (``def read`` of ``Session`` stays ``read``).
NOT_IN_DEFINITIONS = {"read", "iter_lines", "iter_bytes", "closing"}

#: Sync names (before renaming) whose async twins are awaited, iterated with ``async for``, entered with
#: ``async with``; the async driver's own coroutine functions and async generators are added to the first
#: two from ``_async_driver.py``.
AWAITED = {"read"}
ITERATED = {"iter_lines", "iter_bytes"}
ENTERED = {"closing"}
#: Methods that are async whatever their body.
ALWAYS_ASYNC = {"__enter__", "__exit__"}

#: Annotations that differ: (sync class, method, parameter or "return") -> (async annotation, why).
ANNOTATIONS: dict[tuple[str, str, str], tuple[str, str]] = {
    ("SandboxClient", "create", "return"): (
        "_Creating[AsyncSandbox]",
        "the async create answers an awaitable that is also an async context manager (_async_driver.Creating)",
    ),
    ("Sandbox", "session", "return"): (
        "_Creating[AsyncSession]",
        "the async session answers an awaitable that is also an async context manager (_async_driver.Creating)",
    ),
    ("RolloutGroup", "drive", "episode"): (
        "Callable[[AsyncSandbox], Awaitable[EpisodeResult] | EpisodeResult]",
        "the async episode may be a coroutine function (or a plain one)",
    ),
}
#: What the async annotations need, added after the imports of client.py.
EXTRA_IMPORTS = [
    "from collections.abc import Awaitable",
    "from ._async_driver import Creating as _Creating",
]

#: Docstring rewrites where the behaviour differs: (sync class or "" for the module, member or "" for the
#: class itself) -> [(sync text, async text)]. Whitespace (line breaks included) matches any whitespace.
DOCSTRINGS: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("", ""): [
        ("The synchronous client:", "The asyncio client:"),
        (
            "The one source of the public surface: ``aio.py`` (the asyncio client) is generated from this file by "
            "``scripts/gen_aio.py``. Each method runs the core's plan of its operation with the driver "
            "(``_sync_driver.py`` here, ``_async_driver.py`` there).",
            "The sync client's surface, with ``await``. Generated from ``client.py`` by ``scripts/gen_aio.py``: "
            "do not edit this file. Each method runs the core's plan of its operation with the driver of "
            "``_async_driver.py``.",
        ),
    ],
    ("SandboxClient", ""): [("Synchronous client", "Asyncio client")],
    ("SandboxClient", "create"): [(
        "Returns its handle, a context manager: ``with client.create(...) as sbx:``.",
        "Await it for the handle, or use it as ``async with client.create(...) as sbx:``.",
    )],
    ("Sandbox", "session"): [(
        "Returns its handle, a context manager: ``with sbx.session() as sh:`` closes the session at the end "
        "of the block.",
        "Await it for the handle, or use it as ``async with sbx.session() as sh:``, which closes the session "
        "at the end of the block.",
    )],
    ("Sandbox", "forward_port"): [(
        "``with sbx.forward_port(9222) as local_port:``",
        "``async with sbx.forward_port(9222) as local_port:``",
    )],
    ("Sandbox", "stop_heartbeats"): [(
        "stops the background thread, waiting at most 5 s for it",
        "cancels the background task",
    )],
    ("RolloutGroup", "drive"): [
        (
            "runs ``episode(sandbox)`` in a worker thread",
            "runs ``await episode(sandbox)`` (a coroutine function, or a plain one) as a task",
        ),
        ("are waited for", "are cancelled"),
        ("(``KeyboardInterrupt``,", "(cancelling the task,"),
    ],
}

#: General docstring rules, applied after ``DOCSTRINGS``: (pattern, replacement).
DOC_RULES: list[tuple[str, str]] = [
    (r"``with``", "``async with``"),
    (r"\b([Aa])\s+context\s+manager\b", r"\1n async context manager"),
    (r"\bbackground\s+thread\b", "background task"),
]
#: A paragraph of a rewritten docstring with a longer line than this is re-wrapped to ``WRAP`` columns.
LONGEST = 113
WRAP = 110

HEADER = """\
# Generated from client.py by scripts/gen_aio.py: do not edit. Write a public method once, in client.py,
# then run `make sdk-aio` (python sdk/python/scripts/gen_aio.py); tests/test_generated.py fails while this
# file differs from what the generator makes.
"""


class GenerationError(Exception):
    """client.py uses something the rules cannot translate, or a rule no longer matches."""


# -- what the async driver defines --------------------------------------------------------------------


def driver_names(source: str) -> tuple[set[str], set[str]]:
    """The async driver's coroutine functions and async generators (module functions and methods), by
    name; a name that is also a plain function there is ambiguous, hence an error."""
    coroutines: set[str] = set()
    generators: set[str] = set()
    plain: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AsyncFunctionDef) and not node.name.startswith("__"):
            own = [n for n in _own_nodes(node) if isinstance(n, (ast.Yield, ast.YieldFrom))]
            (generators if own else coroutines).add(node.name)
        elif isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
            plain.add(node.name)
    if ambiguous := (coroutines | generators) & plain:
        raise GenerationError(f"_async_driver.py defines {sorted(ambiguous)} both as async and as plain functions")
    return coroutines, generators


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body, without those of nested functions, lambdas and classes."""
    found: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return found


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _is_self_call(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"


# -- the translation --------------------------------------------------------------------------------


class Translator:
    def __init__(self, source: str, driver_source: str) -> None:
        self.source = source
        self.tree = ast.parse(source)
        coroutines, generators = driver_names(driver_source)
        self.awaited = AWAITED | coroutines
        self.iterated = ITERATED | generators
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.edits: list[tuple[int, int, str]] = []
        self.used_docstrings: set[tuple[str, str, int]] = set()
        self.used_rules: set[int] = set()
        self.used_annotations: set[tuple[str, str, str]] = set()

    # positions

    def offset(self, lineno: int, col: int) -> int:
        """The character offset of an AST position (``col`` counts UTF-8 bytes)."""
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def insert(self, at: int, text: str) -> None:
        self.edits.append((at, at, text))

    def replace(self, node: ast.AST, text: str) -> None:
        start, end = self.span(node)
        self.edits.append((start, end, text))

    # which methods are async

    def awaits(self, call: ast.Call, async_methods: set[str]) -> bool:
        name = _called_name(call)
        return name in self.awaited or (_is_self_call(call) and name in async_methods)

    def needs_async(self, function: ast.FunctionDef, async_methods: set[str]) -> bool:
        if function.name in ALWAYS_ASYNC:
            return True
        for node in _own_nodes(function):
            if isinstance(node, ast.Call) and self.awaits(node, async_methods):
                return True
            if isinstance(node, ast.For) and self.iterates(node):
                return True
            if isinstance(node, ast.With) and self.enters(node):
                return True
        return False

    def iterates(self, loop: ast.For) -> bool:
        return isinstance(loop.iter, ast.Call) and _called_name(loop.iter) in self.iterated

    def enters(self, statement: ast.With) -> bool:
        calls = [item.context_expr for item in statement.items if isinstance(item.context_expr, ast.Call)]
        entered = [call for call in calls if _called_name(call) in ENTERED]
        if entered and len(entered) != len(statement.items):
            raise GenerationError(f"line {statement.lineno}: a with statement mixing sync and async context managers")
        return bool(entered)

    def async_methods(self, cls: ast.ClassDef) -> set[str]:
        functions = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
        found: set[str] = set()
        while True:
            more = {f.name for f in functions if self.needs_async(f, found)}
            if more <= found:
                return found
            found |= more

    # edits

    def translate_function(self, function: ast.FunctionDef, owner: str, async_methods: set[str]) -> None:
        if function.name in async_methods:
            self.insert(self.offset(function.lineno, function.col_offset), "async ")
        for node in _own_nodes(function):
            if isinstance(node, ast.For) and self.iterates(node):
                self.insert(self.span(node)[0], "async ")
            if isinstance(node, ast.With) and self.enters(node):
                self.insert(self.span(node)[0], "async ")
        parents = {child: parent for parent in ast.walk(function) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and self.awaits(node, async_methods)):
                continue
            scope = parents.get(node)
            while scope is not None and scope is not function:
                if isinstance(scope, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ListComp, ast.SetComp,
                                      ast.DictComp, ast.GeneratorExp)):
                    raise GenerationError(
                        f"line {node.lineno}: {_called_name(node)}() is awaited in async code but called inside a "
                        f"{type(scope).__name__.lower()} of {owner}.{function.name}"
                    )
                scope = parents.get(scope)
            start, end = self.span(node)
            parent = parents.get(node)
            used_further = (
                isinstance(parent, (ast.Attribute, ast.Subscript)) and parent.value is node
                or isinstance(parent, ast.Call) and parent.func is node
            )
            if used_further:
                self.insert(start, "(await ")
                self.insert(end, ")")
            else:
                self.insert(start, "await ")
        if isinstance(node := function.body[0], ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            self.translate_docstring(node.value, owner, function.name)
        self.translate_annotations(function, owner)

    def translate_annotations(self, function: ast.FunctionDef, owner: str) -> None:
        arguments = function.args.posonlyargs + function.args.args + function.args.kwonlyargs
        arguments += [a for a in (function.args.vararg, function.args.kwarg) if a is not None]
        for (cls, method, which), (text, _why) in ANNOTATIONS.items():
            if (cls, method) != (owner, function.name):
                continue
            node = function.returns if which == "return" else next((a.annotation for a in arguments if a.arg == which), None)
            if node is None:
                raise GenerationError(f"ANNOTATIONS names {cls}.{method} {which}, which has no annotation")
            self.replace(node, text)
            self.used_annotations.add((cls, method, which))

    def translate_docstring(self, literal: ast.Constant, owner: str, member: str) -> None:
        start, end = self.span(literal)
        original = self.source[start:end]
        text = original
        for index, (sync_text, async_text) in enumerate(DOCSTRINGS.get((owner, member), [])):
            pattern = r"\s+".join(re.escape(word) for word in sync_text.split())
            text, count = re.subn(pattern, async_text.replace("\\", "\\\\"), text)
            if count != 1:
                raise GenerationError(f"DOCSTRINGS[{owner!r}, {member!r}]: {sync_text!r} found {count} times, not once")
            self.used_docstrings.add((owner, member, index))
        for index, (pattern, replacement) in enumerate(DOC_RULES):
            text, count = re.subn(pattern, replacement, text)
            if count:
                self.used_rules.add(index)
        text = re.sub(r":(?:class|meth|attr|func):`[^`]*`", _rename_in_role, text)
        if text != original:
            column = self.offset(literal.lineno, literal.col_offset) - self.starts[literal.lineno - 1]
            text = _rewrap(original, text, column)
            self.edits.append((start, end, text))

    def translate(self) -> str:
        module_doc = self.tree.body[0]
        if isinstance(module_doc, ast.Expr) and isinstance(module_doc.value, ast.Constant):
            self.translate_docstring(module_doc.value, "", "")
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef):
                async_methods = self.async_methods(node)
                if isinstance(doc := node.body[0], ast.Expr) and isinstance(doc.value, ast.Constant):
                    self.translate_docstring(doc.value, node.name, "")
                for function in node.body:
                    if isinstance(function, ast.FunctionDef):
                        overload = any(isinstance(d, ast.Name) and d.id == "overload" for d in function.decorator_list)
                        methods = async_methods | ({function.name} if overload and function.name in async_methods else set())
                        self.translate_function(function, node.name, methods)
                    elif isinstance(function, ast.AsyncFunctionDef):
                        raise GenerationError(f"{node.name}.{function.name}: client.py is the sync source, without async def")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                raise GenerationError(f"line {node.lineno}: module-level function {node.name}: put it in _sync_driver.py")
        imports = [n for n in self.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        self.insert(self.starts[imports[-1].end_lineno], "".join(f"{line}\n" for line in EXTRA_IMPORTS))  # type: ignore[index]
        self.check_tables_used()
        text = self.source
        for start, end, new in sorted(self.edits, key=lambda e: (e[0], e[1]), reverse=True):
            text = text[:start] + new + text[end:]
        return HEADER + _rename_tokens(text)

    def check_tables_used(self) -> None:
        stale = [f"ANNOTATIONS{key}" for key in ANNOTATIONS if key not in self.used_annotations]
        stale += [
            f"DOCSTRINGS[{owner!r}, {member!r}][{i}]"
            for (owner, member), rewrites in DOCSTRINGS.items() for i in range(len(rewrites))
            if (owner, member, i) not in self.used_docstrings
        ]
        stale += [f"DOC_RULES[{i}] ({DOC_RULES[i][0]!r})" for i in range(len(DOC_RULES)) if i not in self.used_rules]
        if stale:
            raise GenerationError("stale entries (they match nothing in client.py): " + ", ".join(stale))


def _rename_in_role(match: re.Match[str]) -> str:
    return re.sub(r"\b(" + "|".join(CLASSES) + r")\b", lambda m: CLASSES[m.group(1)], match.group(0))


def _rewrap(original: str, text: str, column: int) -> str:
    """Re-wraps the paragraphs of a rewritten docstring literal that got a line longer than ``LONGEST``
    (``column``: where the literal starts on its first line)."""
    separator = re.compile(r"\n[ \t]*\n")
    paragraphs = separator.split(text)
    breaks = separator.findall(text)
    later = [line for line in original.split("\n")[1:] if line.strip()]
    indent = re.match(r"[ \t]*", later[0]).group(0) if later else " " * column  # type: ignore[union-attr]
    out = []
    for index, paragraph in enumerate(paragraphs):
        first = column if index == 0 else 0
        widths = [first + len(line) for line in paragraph.split("\n")[:1]] + [len(line) for line in paragraph.split("\n")[1:]]
        if max(widths) > LONGEST:
            lead = "" if index == 0 else re.match(r"[ \t]*", paragraph).group(0)  # type: ignore[union-attr]
            lines = textwrap.wrap(
                " ".join(paragraph.split()), WRAP, initial_indent=" " * column if index == 0 else lead,
                subsequent_indent=indent, break_long_words=False, break_on_hyphens=False,
            )
            paragraph = "\n".join(lines)[column:] if index == 0 else "\n".join(lines)
        out.append(paragraph)
    return "".join(p + (breaks[i] if i < len(breaks) else "") for i, p in enumerate(out))


def _rename_tokens(text: str) -> str:
    """Applies ``RENAMES`` to identifiers, and ``CLASSES`` to string literals that are exactly a class
    name (``__all__``)."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    edits = []
    previous = None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        new = None
        defined = previous is not None and previous.type == tokenize.NAME and previous.string == "def"
        if token.type == tokenize.NAME and token.string in RENAMES and not (defined and token.string in NOT_IN_DEFINITIONS):
            new = RENAMES[token.string]
        elif token.type == tokenize.STRING and token.string[1:-1] in CLASSES and token.string[0] == token.string[-1] == '"':
            new = f'"{CLASSES[token.string[1:-1]]}"'
        if new is not None:
            (row, col), (end_row, end_col) = token.start, token.end
            edits.append((starts[row - 1] + col, starts[end_row - 1] + end_col, new))
        previous = token
    for start, end, new in reversed(edits):
        text = text[:start] + new + text[end:]
    return text


def generate(source: str | None = None, driver: str | None = None) -> str:
    """The text of ``aio.py`` for ``client.py``'s text (the files' by default)."""
    if source is None:
        source = SOURCE.read_text()
    if driver is None:
        driver = DRIVER.read_text()
    return Translator(source, driver).translate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="do not write: exit 1 with a diff when aio.py is stale")
    args = parser.parse_args()
    try:
        text = generate()
    except GenerationError as error:
        print(f"gen_aio.py: {error}", file=sys.stderr)
        return 2
    current = TARGET.read_text() if TARGET.exists() else ""
    if args.check:
        if current != text:
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(keepends=True), text.splitlines(keepends=True), "aio.py (committed)", "aio.py (generated)"))
            print("aio.py is stale: run `make sdk-aio`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        TARGET.write_text(text)
        print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
