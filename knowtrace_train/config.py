"""YAML config files and command-line overrides -> nested typed dataclasses.

`load_config(cls, path, overrides)` reads a YAML mapping, applies `--key value`,
`--key=value` and `--a.b value` overrides (values read as YAML scalars: `16` is an int,
`true` a bool, `null` None; a field typed `str` keeps the text as written), and builds `cls`
with every field checked against its annotation. A nested section sets only the keys it names:
the others keep the parent's default for that section (its `default_factory` value), not the
nested class's own defaults. An unknown key or a wrong type raises
`ConfigError` naming the key and where it came from (the file, or the command line).
Any dataclass works: recipes reuse this for evaluation and self-training configs, and
`run_recipe` is their common `main` (`--config FILE`, `--quiet`, overrides, config errors -> exit 2).
A field's one-line help is its `metadata["help"]` (TRL's convention); `config_help(cls)` lists every
dotted key with its default and help, and a recipe's `--help` prints that list.
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import difflib
import logging
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import yaml

from knowtrace_train.errors import DEBUG_ENV, UserError, debug_requested, guarded
from knowtrace_train.io import DataFileError, read_text

T = TypeVar("T")

COMMAND_LINE = "command line"


#: a decimal number with an exponent and no dot, which YAML 1.1 leaves a string ("1e-3", "5E+4")
_FLOAT = re.compile(r"[-+]?\d+(?:\.\d*)?[eE][-+]?\d+")


class ConfigError(UserError, ValueError):
    """A config that does not fit its dataclass; the message names the key and the source."""

    label = "config error"


class TaggedConfig:
    """A config section whose dataclass is chosen by its `name` key: `section_class(name)` gives the
    class (a registry lookup), so `strategy: {name: knowtrace, max_rounds: 3}` builds the named
    method's config. The keys not given keep the default of that class (or the parent's default
    section where it is of the same class)."""

    name: str

    @classmethod
    def section_class(cls, name: str) -> type:
        raise NotImplementedError


class _Raw(str):
    """A value as typed on the command line (kept as text for `str` fields)."""


class _Flag(_Raw):
    """`--key` with no value: true for a bool field; any other field says it needs a value."""


def parse_overrides(args: Sequence[str], aliases: Mapping[str, str] | None = None) -> dict[str, _Raw]:
    """`["--a.b", "1", "--c=x", "--flag"]` -> {"a.b": "1", "c": "x", "flag": "true"}."""
    out: dict[str, _Raw] = {}
    aliases = dict(aliases or {})
    i = 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"{COMMAND_LINE}: expected --key value, got {arg!r}")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
            i += 2
        else:
            value = None
            i += 1
        key = key.replace("-", "_") if "." not in key else ".".join(k.replace("-", "_") for k in key.split("."))
        key = aliases.get(key, key)
        out[key] = _Flag("true") if value is None else _Raw(value)
    return out


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = {}
            node[p] = child
        node = child
    node[parts[-1]] = value


class _Sources:
    """Which source set which dotted key (for error messages)."""

    def __init__(self, default: str, overridden: Sequence[str]) -> None:
        self.default = default
        self.overridden = set(overridden)

    def of(self, dotted: str) -> str:
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in self.overridden:
                return f"{COMMAND_LINE} (--{'.'.join(parts[:n])})"
        return self.default

    def within(self, prefix: str) -> str:
        """The sources of a whole section (for errors no single key owns, like a `__post_init__` check)."""
        keys = sorted(k for k in self.overridden if not prefix or k == prefix or k.startswith(prefix + "."))
        if not keys:
            return self.default
        return f"{self.default} with {COMMAND_LINE} ({', '.join('--' + k for k in keys)})"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str, src: _Sources, base: Any = None) -> Any:
    """`value` as type `tp`; `base` is the default a nested dataclass section starts from (or None)."""
    where = f"{src.of(key)}: {key}"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(value, _Flag) and tp is not bool and bool not in args and tp is not Any:
        raise ConfigError(f"{src.of(key)}: --{key} needs a value (--{key} VALUE)")

    if tp is Any or tp is object:
        return yaml.safe_load(value) if isinstance(value, _Raw) else value
    if origin is typing.Union or (types.UnionType is not None and isinstance(tp, types.UnionType)):
        if isinstance(value, _Raw) and str in args:
            return None if value == "null" and type(None) in args else str(value)
        parsed = yaml.safe_load(value) if isinstance(value, _Raw) else value
        if parsed is None and type(None) in args:
            return None
        for arm in args:
            if arm is type(None):
                continue
            try:
                return _convert(parsed, arm, key, src, base)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {parsed!r}")
    if isinstance(value, _Raw) and tp is not str:
        text = value
        value = yaml.safe_load(text) if text.strip() else ""
        if origin in (list, tuple, collections.abc.Sequence) and isinstance(value, str) and "," in text:
            value = [yaml.safe_load(part) for part in text.split(",")]  # --seeds 0,1,2 on the command line
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}")
        if isinstance(tp, type) and issubclass(tp, TaggedConfig):
            tp, base = _tagged_class(tp, value, key, src, base)
        return _build(tp, value, key, src, base if isinstance(base, tp) else None)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            # YAML 1.1 reads "1e-3" (no dot) as a string; a researcher means the number
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (bool, dict, list)) or value is None:
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise ConfigError(f"{where}: expected a path, got {value!r}")
        return Path(value)
    if origin in (list, tuple, collections.abc.Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) != len(value):
                raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
            return tuple(_convert(v, a, f"{key}[{i}]", src) for i, (v, a) in enumerate(zip(value, args)))
        item_tp = args[0] if args else Any
        items = [_convert(v, item_tp, f"{key}[{i}]", src) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        ktp, vtp = args if args else (Any, Any)
        return {_convert(k, ktp, key, src): _convert(v, vtp, f"{key}.{k}", src) for k, v in value.items()}
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def _tagged_class(tp: type, value: Mapping[str, Any], key: str, src: _Sources, base: Any) -> tuple[type, Any]:
    """The class a tagged section names (its `name` key, else the default's name) and the default
    it starts from (the parent's default where that is of the named class, else none)."""
    name = value.get("name", getattr(base, "name", None))
    if name is None:
        name = next((f.default for f in dataclasses.fields(tp) if f.name == "name"), None)
    try:
        cls = tp.section_class(str(name))
    except ValueError as e:
        raise ConfigError(f"{src.of(key + '.name')}: {key}.name: {e}") from e
    return cls, base if type(base) is cls else None


def _field_default(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one from its factory), or None where it has none."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _build(cls: type[T], data: Mapping[str, Any], prefix: str, src: _Sources, base: Any = None) -> T:
    """`cls` from the keys in `data`; the keys not given keep `base`'s values when a base is given
    (the parent's default for this section), else the class's defaults."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for k, v in data.items():
        dotted = f"{prefix}.{k}" if prefix else str(k)
        if k not in fields:
            close = difflib.get_close_matches(str(k), list(fields), n=1)
            hint = f" (did you mean {'.'.join(filter(None, [prefix, close[0]]))!r}?)" if close else ""
            raise ConfigError(f"{src.of(dotted)}: unknown key {dotted!r} for {cls.__name__}{hint}")
        # a nested section starts from the default it replaces (used only where the type is a dataclass)
        sub_base = getattr(base, k) if base is not None else _field_default(fields[k])
        kwargs[k] = _convert(v, hints[k], dotted, src, sub_base)
    if base is None:
        for name, f in fields.items():
            if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                dotted = f"{prefix}.{name}" if prefix else name
                raise ConfigError(f"{src.default}: missing required key {dotted!r}")
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{src.within(prefix)}: {prefix or cls.__name__}: {e}") from e


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the last would win without a word)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: the constructor says so
                    continue
                if first != key_node.start_mark.line + 1:
                    raise ConfigError(f"{self.name}:{key_node.start_mark.line + 1}: key {key!r} given twice (first on "
                                      f"line {first}): keep one")
        return super().construct_mapping(node, deep=deep)


def yaml_error_line(path: str | Path, e: yaml.YAMLError) -> str:
    """A YAML parse error as one line: the file, its line and column, what is wrong."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
    return f"{where}: not valid YAML ({' '.join(what.split())})"


def parse_yaml(text: str, path: str | Path) -> Any:
    """YAML text of the file `path` (named in errors) -> its value; a key given twice or a parse error is a
    `ConfigError` naming the file and line."""
    loader = None
    try:
        loader = _UniqueKeyLoader(text)  # its reader refuses control characters already
        loader.name = str(path)
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise ConfigError(yaml_error_line(path, e)) from e
    except RecursionError as e:
        raise ConfigError(f"{path}: not valid YAML (nested too deeply)") from e
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from `path` (an empty file is an empty mapping)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: a folder, not a YAML file: name the config file")
    try:
        text = read_text(path)
    except DataFileError as e:
        raise ConfigError(str(e)) from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from e
    data = parse_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    aliases: Mapping[str, str] | None = None,
    data: Mapping[str, Any] | None = None,
) -> T:
    """Build `cls` from the YAML file at `path` (optional) and command-line `overrides`
    (`--key value`, `--key=value`, `--a.b value`; `aliases` maps short keys to dotted ones).
    `data` replaces the file's content where a caller has read and amended it (errors still name `path`)."""
    data = dict(data) if data is not None else read_yaml(path) if path is not None else {}
    parsed = parse_overrides(overrides or (), aliases)
    for k, v in parsed.items():
        _set_dotted(data, k, v)
    src = _Sources(str(path) if path is not None else "defaults", list(parsed))
    return _build(cls, data, "", src)


def _yaml_value(value: Any) -> str:
    """`value` as one line of YAML (`0.001`, `null`, `''`, `[1, 2]`, `{}`)."""
    text = yaml.safe_dump(config_to_dict(value), default_flow_style=True, width=float("inf"), allow_unicode=True)
    text = text.strip()
    return text[: -len("...")].strip() if text.endswith("\n...") else text


def _walk(cls: type, prefix: str, default: Any) -> list[tuple[str, str, str, bool]]:
    """(dotted key, default as YAML, help, is_section) for every field of `cls`, nested sections
    first as a row of their own and then their keys; `default` is the instance whose values are shown."""
    rows: list[tuple[str, str, str, bool]] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(default, f.name) if default is not None else _field_default(f)
        text = str(f.metadata.get("help", ""))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            # a nested section: its keys show this instance's values (for a tagged section such as
            # `strategy`, the class its default names, e.g. KnowTraceConfig)
            rows.append((key, type(value).__name__, text, True))
            rows.extend(_walk(type(value), key, value))
        else:
            rows.append((key, _yaml_value(value), text, False))
    return rows


def config_help(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """Every key of the config dataclass `cls`: (dotted key, default as YAML, one-line help), nested
    sections walked. A section's keys show the defaults of the parent's default for it (the instance its
    `default_factory` makes), as loading does: `bootstrap.train.learning_rate` is the bootstrap's
    0.001, not LoraTrainConfig's. A help missing from a field's metadata is ""."""
    return [(key, default, text) for key, default, text, section in _walk(cls, prefix, None) if not section]


def config_epilog(cls: type) -> str:
    """The key list a recipe's `--help` ends with: `--key  (default: VALUE)  help`, one line per key,
    grouped by section under the section's help."""
    rows = _walk(cls, "", None)
    sections: dict[str, str] = {"": f"top level [{cls.__name__}]"}
    keys: dict[str, list[str]] = {"": []}
    for key, default, text, section in rows:
        if section:
            sections[key] = f"{key}: {text} [{default}]" if text else f"{key}: [{default}]"
            keys[key] = []
        else:
            keys[key.rpartition(".")[0]].append(f"    --{key}  (default: {default})  {text}".rstrip())
    lines = ["Config keys (every one can be given as --key value, nested ones as --section.key value):"]
    for name, header in sections.items():
        if keys[name]:
            lines += ["", f"  {header}", *keys[name]]
    return "\n".join(lines)


@dataclasses.dataclass
class RecipeArgs:
    """A recipe's command line: the config file, --quiet, the `--key value` overrides and --debug."""

    config: str | None
    quiet: bool
    overrides: list[str]
    debug: bool = False


def parse_recipe_args(
    argv: Sequence[str] | None, doc: str | None, config_file_help: str, config_class: type | None = None
) -> RecipeArgs:
    """Parse a recipe's command line (`--config FILE`, `--quiet`, every other `--key value` pair an
    override of the config; `doc`'s first line is the description) and set up logging: INFO, or
    WARNING with --quiet. `--help` ends with every key of `config_class` (where given), its default
    and its help (`config_epilog`)."""
    epilog = "Other --key value pairs override the config."
    if config_class is not None:
        epilog += "\n\n" + config_epilog(config_class)
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n")[0], epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help=config_file_help)
    parser.add_argument("--quiet", action="store_true", help="no progress bars, warnings only")
    parser.add_argument("--debug", action="store_true",
                        help=f"a user error (config, data, corpus, run folder, model) shows its traceback too (or {DEBUG_ENV}=1)")
    args, overrides = parser.parse_known_args(None if argv is None else list(argv))
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    # faiss's loader logs each CPU-specific library it could not load, a traceback's repr a line, at INFO
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    return RecipeArgs(config=args.config, quiet=args.quiet, overrides=overrides, debug=args.debug or debug_requested())


def run_recipe(
    argv: Sequence[str] | None,
    doc: str | None,
    config_file_help: str,
    load: Callable[[str | None, list[str]], T],
    run: Callable[[T, RecipeArgs], int],
    config_class: type | None = None,
) -> int:
    """A recipe's `main`: parse its command line (`parse_recipe_args`; `--help` lists every key of
    `config_class`), build the config with `load(config file, overrides)`, then return `run(config, args)`.
    A user's error from either (`UserError`: a config, a data file, a corpus, a run folder, a model, a
    missing extra) is printed to stderr as one line, `config error: ...` or the like, and exits 2; with
    `--debug` it keeps its traceback."""
    args = parse_recipe_args(argv, doc, config_file_help, config_class)
    return guarded(lambda: run(load(args.config, args.overrides), args), args.debug)


def config_to_dict(obj: Any) -> Any:
    """A config dataclass as plain YAML/JSON values (paths as strings, tuples as lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: config_to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [config_to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): config_to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def dump_config(obj: Any) -> str:
    """YAML text that `load_config(type(obj), ...)` reads back to an equal object."""
    return yaml.safe_dump(config_to_dict(obj), sort_keys=False, allow_unicode=True)
