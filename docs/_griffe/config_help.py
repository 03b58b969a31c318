"""A griffe extension for the API reference: a config field's one-line help is its docstring.

The config dataclasses carry each field's help in `field(metadata={"help": ...})`, the text that a recipe's
`--help` prints. This reads it from the source (statically, as griffe reads everything) and gives it to the
attribute as its docstring, so the reference and `--help` say the same thing from one place. A field that
already has a docstring, or whose help is not a literal string, is left as it is.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe


def _help(value: ast.expr | None) -> str | None:
    """The literal `metadata={"help": "..."}` of a `field(...)` call, else None."""
    if not isinstance(value, ast.Call) or getattr(value.func, "id", getattr(value.func, "attr", None)) != "field":
        return None
    for kw in value.keywords:
        if kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
            for k, v in zip(kw.value.keys, kw.value.values):
                if isinstance(k, ast.Constant) and k.value == "help" and isinstance(v, ast.Constant):
                    return v.value if isinstance(v.value, str) else None
    return None


def _markdown(text: str) -> str:
    """`text` as Markdown that shows it as written: `<`, `>` and `&` outside code spans as entities (a help's
    `runs/<name>` is no HTML tag), code spans as they are."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                   for p in parts)


class ConfigHelp(griffe.Extension):
    def on_attribute_instance(self, *, node: Any, attr: griffe.Attribute, agent: Any, **kwargs: Any) -> None:
        if attr.docstring is None and isinstance(node, ast.AnnAssign):
            text = _help(node.value)
            if text:
                attr.docstring = griffe.Docstring(_markdown(text), parent=attr)
