"""A strict renderer for the subset of Helm's Go templates that spotgpu's chart uses.

Why this exists: ``helm`` is not packaged for Debian 12 nor on PyPI for our Python, and nothing
may be downloaded outside the package registries, so the chart tests cannot run ``helm
template``. This renderer implements Go ``text/template`` semantics for the constructs the chart
uses and **fails loudly on anything else** (an unknown function, action or syntax raises
:class:`TemplateError`), so the chart cannot silently grow beyond what is tested. Where Helm's
output is defined by Go (``toYaml`` sorts keys and drops the trailing newline; missing values
render empty; ``{{-``/``-}}`` trim whitespace), the same is done here.

Supported: ``{{ pipeline }}``, ``{{- -}}``, comments, ``if``/``else if``/``else``, ``range``
(over lists and maps, with ``$k, $v :=``), ``with``, ``define``/``include``/``template``,
variables (``$x :=`` declares in the current block, ``$x =`` assigns to the variable declared in
the nearest enclosing block, as Go does; ``$``), parenthesised pipelines, method ``.Files.Get``,
and the functions in :data:`FUNCS` (``fail`` raises :class:`TemplateError` with its message, as
``helm template`` fails).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    pass


# ----------------------------------------------------------------------------- lexing

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<num>-?\d+(?:\.\d+)?)|
        (?P<assign>:=)|(?P<eq>=)|(?P<pipe>\|)|(?P<lp>\()|(?P<rp>\))|(?P<comma>,)|
        (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)|(?P<field>(?:\.[A-Za-z0-9_]+)+|\.)|
        (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.X,
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"cannot parse {text[pos:]!r} in {{{{ {text} }}}}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


# ----------------------------------------------------------------------------- parsing


@dataclass
class Node:
    kind: str  # text, out, if, range, with, define, template, assign
    text: str = ""
    tokens: list[tuple[str, str]] = field(default_factory=list)
    body: list[Node] = field(default_factory=list)
    branches: list[tuple[list[tuple[str, str]] | None, list[Node]]] = field(default_factory=list)
    name: str = ""


def parse(source: str, name: str = "template") -> tuple[list[Node], dict[str, list[Node]]]:
    pieces: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(source):
        text = source[pos : m.start()]
        if m.group(1):
            text = text.rstrip()
        pieces.append(("text", text))
        pieces.append(("action", m.group(2).strip()))
        pos = m.end()
        if m.group(3):
            while pos < len(source) and source[pos].isspace():
                pos += 1
    pieces.append(("text", source[pos:]))
    defines: dict[str, list[Node]] = {}
    stack: list[tuple[Node, list[Node]]] = []
    root: list[Node] = []
    current = root
    for kind, text in pieces:
        if kind == "text":
            if text:
                current.append(Node("text", text=text))
            continue
        if text.startswith("/*"):
            continue
        toks = _tokens(text)
        head = toks[0][1] if toks and toks[0][0] == "ident" else ""
        if head in ("if", "range", "with"):
            node = Node(head, branches=[(toks[1:], [])])
            current.append(node)
            stack.append((node, current))
            current = node.branches[0][1]
        elif head == "define":
            node = Node("define", name=json.loads(toks[1][1]))
            stack.append((node, current))
            current = node.body
        elif head == "else":
            if not stack:
                raise TemplateError(f"{name}: else without if")
            node = stack[-1][0]
            cond = toks[2:] if len(toks) > 1 and toks[1] == ("ident", "if") else None
            if len(toks) > 1 and cond is None:
                raise TemplateError(f"{name}: unsupported {{{{ {text} }}}}")
            node.branches.append((cond, []))
            current = node.branches[-1][1]
        elif head == "end":
            if not stack:
                raise TemplateError(f"{name}: end without block")
            node, current = stack.pop()
            if node.kind == "define":
                defines[node.name] = node.body
        elif head == "template":
            current.append(Node("template", tokens=toks[1:]))
        elif len(toks) >= 2 and toks[0][0] == "var" and toks[1][0] in ("assign", "eq"):
            current.append(Node("assign", name=toks[0][1], tokens=toks[2:], text=toks[1][0]))
        else:
            current.append(Node("out", tokens=toks))
    if stack:
        raise TemplateError(f"{name}: unclosed {stack[-1][0].kind}")
    return root, defines


# ----------------------------------------------------------------------------- values


def truthy(v: Any) -> bool:
    return not (v is None or v is False or v == 0 or v == "" or (isinstance(v, list | dict | tuple) and not v))


def to_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, dict | list):
        raise TemplateError(f"refusing to print a {type(v).__name__} directly (use toYaml): {v!r}")
    return str(v)


def to_yaml(v: Any) -> str:
    if v is None:
        return "null"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True, width=10_000).rstrip("\n")


def indent(n: int, s: str) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in s.split("\n"))


def go_printf(fmt: str, *args: Any) -> str:
    out, i = [], 0
    it = iter(args)
    while i < len(fmt):
        if fmt[i] == "%" and i + 1 < len(fmt):
            verb = fmt[i + 1]
            i += 2
            if verb == "%":
                out.append("%")
            elif verb in "sdv":
                out.append(to_text(next(it)))
            elif verb == "q":
                out.append(json.dumps(to_text(next(it))))
            else:
                raise TemplateError(f"printf verb %{verb} is not supported")
        else:
            out.append(fmt[i])
            i += 1
    return "".join(out)


def _required(msg: str, v: Any) -> Any:
    if not truthy(v):
        raise TemplateError(f"required: {msg}")
    return v


def _fail(msg: str) -> Any:
    raise TemplateError(f"fail: {msg}")


def _add(*v: Any) -> int:
    """sprig's ``add``: every argument as an int64."""
    return sum(int(x) for x in v)


FUNCS: dict[str, Callable[..., Any]] = {
    "toYaml": to_yaml,
    "toJson": lambda v: json.dumps(v, sort_keys=True, separators=(",", ":")),
    "nindent": lambda n, s: "\n" + indent(int(n), s),
    "indent": lambda n, s: indent(int(n), s),
    "quote": lambda *v: " ".join(json.dumps(to_text(x)) for x in v),
    "default": lambda d, *v: v[0] if v and truthy(v[0]) else d,
    "printf": go_printf,
    "trunc": lambda n, s: s[: int(n)] if int(n) >= 0 else s[int(n) :],
    "trimSuffix": lambda suf, s: s[: -len(suf)] if suf and s.endswith(suf) else s,
    "replace": lambda old, new, s: s.replace(old, new),
    "lower": lambda s: s.lower(),
    "eq": lambda a, *b: any(a == x for x in b),
    "ne": lambda a, b: a != b,
    "and": lambda *v: next((x for x in v if not truthy(x)), v[-1]),
    "or": lambda *v: next((x for x in v if truthy(x)), v[-1]),
    "not": lambda v: not truthy(v),
    "int": int,
    "toString": to_text,
    "required": _required,
    "empty": lambda v: not truthy(v),
    "hasKey": lambda d, k: isinstance(d, dict) and k in d,
    "hasPrefix": lambda prefix, s: to_text(s).startswith(prefix),
    "regexMatch": lambda regex, s: re.search(regex, to_text(s)) is not None,
    "add": _add,
    "fail": _fail,
    "sha256sum": lambda s: hashlib.sha256(to_text(s).encode()).hexdigest(),
}

Scope = ChainMap[str, Any]


# ----------------------------------------------------------------------------- evaluation


@dataclass
class Files:
    root: Path

    def Get(self, name: str) -> str:
        path = (self.root / name).resolve()
        if self.root.resolve() not in path.parents:
            raise TemplateError(f".Files.Get {name!r} leaves the chart")
        return path.read_text() if path.exists() else ""


class Renderer:
    def __init__(self, defines: dict[str, list[Node]]) -> None:
        self.defines = defines

    def render(self, nodes: list[Node], dot: Any, scope: Scope) -> str:
        out: list[str] = []
        for node in nodes:
            out.append(self._node(node, dot, scope))
        return "".join(out)

    def _node(self, node: Node, dot: Any, scope: Scope) -> str:
        if node.kind == "text":
            return node.text
        if node.kind == "out":
            return to_text(self.pipeline(node.tokens, dot, scope))
        if node.kind == "assign":
            value = self.pipeline(node.tokens, dot, scope)
            if node.text == "assign":  # $x := declares in this block
                scope.maps[0][node.name] = value
                return ""
            for frame in scope.maps:  # $x = assigns where $x was declared
                if node.name in frame:
                    frame[node.name] = value
                    return ""
            raise TemplateError(f"undefined variable {node.name}")
        if node.kind == "template":
            name = json.loads(node.tokens[0][1])
            arg = self.pipeline(node.tokens[1:], dot, scope) if len(node.tokens) > 1 else None
            return self.include(name, arg)
        if node.kind == "if":
            for cond, body in node.branches:
                if cond is None or truthy(self.pipeline(cond, dot, scope)):
                    return self.render(body, dot, scope.new_child())
            return ""
        if node.kind == "with":
            cond, body = node.branches[0]
            assert cond is not None
            value = self.pipeline(cond, dot, scope)
            if truthy(value):
                return self.render(body, value, scope.new_child())
            return self.render(node.branches[1][1], dot, scope.new_child()) if len(node.branches) > 1 else ""
        if node.kind == "range":
            cond, body = node.branches[0]
            assert cond is not None
            names: list[str] = []
            toks = cond
            if any(t[0] == "assign" for t in cond):
                split = next(i for i, t in enumerate(cond) if t[0] == "assign")
                names = [t[1] for t in cond[:split] if t[0] == "var"]
                toks = cond[split + 1 :]
            value = self.pipeline(toks, dot, scope)
            items = sorted(value.items()) if isinstance(value, dict) else list(enumerate(value or []))
            if not items:
                return self.render(node.branches[1][1], dot, scope.new_child()) if len(node.branches) > 1 else ""
            parts = []
            for key, item in items:
                inner = scope.new_child()
                if len(names) == 1:
                    inner[names[0]] = item
                elif len(names) == 2:
                    inner[names[0]], inner[names[1]] = key, item
                parts.append(self.render(body, item, inner))
            return "".join(parts)
        raise TemplateError(f"unsupported node {node.kind}")

    def include(self, name: str, dot: Any) -> str:
        if name not in self.defines:
            raise TemplateError(f"include of undefined template {name!r}")
        return self.render(self.defines[name], dot, ChainMap({"$": dot}))

    # -- pipelines

    def pipeline(self, toks: list[tuple[str, str]], dot: Any, scope: Scope) -> Any:
        stages: list[list[tuple[str, str]]] = [[]]
        depth = 0
        for t in toks:
            if t[0] == "lp":
                depth += 1
            elif t[0] == "rp":
                depth -= 1
            if t[0] == "pipe" and depth == 0:
                stages.append([])
            else:
                stages[-1].append(t)
        value: Any = _MISSING
        for stage in stages:
            value = self.command(stage, dot, scope, value)
        return None if value is _MISSING else value

    def command(self, toks: list[tuple[str, str]], dot: Any, scope: Scope, piped: Any) -> Any:
        if not toks:
            raise TemplateError("empty command")
        args = self.operands(toks, dot, scope)
        head_kind, head = toks[0]
        if head_kind == "ident" and head not in ("true", "false", "nil"):
            fn = FUNCS.get(head)
            if head == "include":
                fn = self.include
            if fn is None:
                raise TemplateError(f"function {head!r} is not supported by this renderer")
            call_args = args[1:] + ([] if piped is _MISSING else [piped])
            return fn(*call_args)
        if callable(args[0]):
            return args[0](*args[1:], *([] if piped is _MISSING else [piped]))
        if len(args) > 1 or piped is not _MISSING:
            raise TemplateError(f"{toks!r} is not a function but has arguments")
        return args[0]

    def operands(self, toks: list[tuple[str, str]], dot: Any, scope: Scope) -> list[Any]:
        out: list[Any] = []
        i = 0
        while i < len(toks):
            kind, text = toks[i]
            if kind == "lp":
                depth, j = 1, i + 1
                while depth:
                    depth += {"lp": 1, "rp": -1}.get(toks[j][0], 0)
                    j += 1
                out.append(self.pipeline(toks[i + 1 : j - 1], dot, scope))
                i = j
                continue
            if kind == "str":
                out.append(json.loads(text))
            elif kind == "raw":
                out.append(text[1:-1])
            elif kind == "num":
                out.append(float(text) if "." in text else int(text))
            elif kind == "ident":
                out.append({"true": True, "false": False, "nil": None}.get(text, text))
            elif kind == "field":
                out.append(self.lookup(dot, text))
            elif kind == "var":
                name, _, rest = text.partition(".")
                if name not in scope:
                    raise TemplateError(f"undefined variable {name}")
                out.append(self.lookup(scope[name], "." + rest) if rest else scope[name])
            else:
                raise TemplateError(f"unexpected {text!r}")
            i += 1
        return out

    @staticmethod
    def lookup(obj: Any, path: str) -> Any:
        if path == ".":
            return obj
        for part in path.strip(".").split("."):
            if obj is None:
                return None
            if isinstance(obj, Mapping):
                obj = obj.get(part)
            elif hasattr(obj, part):
                obj = getattr(obj, part)
            else:
                return None
        return obj


_MISSING = object()


def render_chart(
    chart_dir: Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "spotgpu",
    namespace: str = "spotgpu-system",
) -> dict[str, str]:
    """Render every template of the chart like ``helm template``: file name -> rendered text."""
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    base = yaml.safe_load((chart_dir / "values.yaml").read_text()) or {}
    merged = _merge(base, dict(values or {}))
    top = {
        "Values": merged,
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm", "IsInstall": True},
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart.get("appVersion", "")},
        "Files": Files(chart_dir),
    }
    defines: dict[str, list[Node]] = {}
    parsed: dict[str, list[Node]] = {}
    for path in sorted((chart_dir / "templates").iterdir()):
        root, defs = parse(path.read_text(), path.name)
        defines.update(defs)
        if not path.name.startswith("_") and path.suffix in (".yaml", ".yml", ".txt"):
            parsed[path.name] = root
    renderer = Renderer(defines)
    return {name: renderer.render(root, top, ChainMap({"$": top})) for name, root in parsed.items()}


def _merge(base: Any, over: Any) -> Any:
    """Helm's coalescing of user values over the chart's: maps merge key by key, a user ``null``
    deletes the chart's default for that key, anything else replaces it."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = _merge(base.get(k), v)
        return out
    return over
