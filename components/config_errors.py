"""One formatter for stack config errors: pydantic's and the cross-field rules' alike.

Each error becomes one line that names the real stack file (`Pulumi.dev.yaml`), the
`file:line:col` of the offending key when the file holds it, the key path
(`modal-llm:services[0].scaling`), what was given, what is allowed, and for an unknown key a
"did you mean" drawn from the keys allowed at that level only. Positions come from PyYAML's
composed node tree (`yaml.compose`: every node carries `start_mark.line` / `.column`, 0-based).
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import annotated_types
import yaml
from pydantic import BaseModel, RootModel, ValidationError
from pydantic.fields import FieldInfo

Loc = tuple[str | int, ...]
#: Marks a Problem whose value is not shown (a missing key, an unknown key, a secret).
NOT_SHOWN: Any = object()
#: Longest repr of a given value in a message; longer ones are cut.
_GIVEN_MAX = 120
#: Past this many allowed keys at one level, point to the reference instead of listing them.
_LIST_MAX = 12


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the config: where (`loc`, top key first), what, and the value.

    `text` is a predicate ("must be true or false", "is not set") or, starting with ":", a
    sentence of its own; `fix` is the next step, when there is one. `secret`: the secret key
    whose absence is the whole problem (a rule that needs it): a preview goes on with that
    secret unknown and warns; `up` refuses."""

    loc: Loc
    text: str
    given: Any = NOT_SHOWN
    fix: str = ""
    secret: str = ""


class ConfigError(ValueError):
    """A stack config value is missing or invalid. The message names the file, the key, what
    was given and how to fix it; `problems` holds the same as data."""

    def __init__(self, message: str, problems: Iterable[Problem] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class RuleError(ValueError):
    """Raised by a cross-field rule inside a model validator: the problems it found, with
    their paths relative to the model that raised it (pydantic keeps the exception in the
    error's `ctx`, and `problems_from` reads it from there)."""

    def __init__(self, *problems: Problem) -> None:
        super().__init__("; ".join(f"{path_text(p.loc)} {p.text}" for p in problems))
        self.problems = problems


def rule(loc: Loc, text: str, given: Any = NOT_SHOWN, fix: str = "") -> RuleError:
    return RuleError(Problem(loc, text, given, fix))


# ---- the stack file: its real name and the positions of its keys ----------------------------


@dataclass
class StackFile:
    """The stack file a config came from, e.g. `Pulumi.local.yaml`, and where its keys are.

    `path` may be None or missing (the program under mocks): then errors name the file
    without a position."""

    name: str
    path: Path | None = None
    _positions: dict[Loc, tuple[int, int]] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, stack: str, directory: Path | None = None) -> StackFile:
        name = f"Pulumi.{stack}.yaml"
        return cls(name, directory / name if directory is not None else None)

    def positions(self) -> dict[Loc, tuple[int, int]]:
        """(full key, *path) -> 1-based (line, column) of each key and list item under
        `config:`; empty when the file cannot be read or parsed."""
        if self._positions is None:
            self._positions = {}
            try:
                root = yaml.compose(self.path.read_text()) if self.path else None
            except (OSError, yaml.YAMLError):
                root = None
            config = _child(root, "config")
            if config is not None:
                _walk(config, (), self._positions)
        return self._positions

    def where(self, path: Loc) -> str:
        """`file:line:col` of `path`, or of the deepest part of it the file holds."""
        positions = self.positions()
        for end in range(len(path), 0, -1):
            pos = positions.get(path[:end])
            if pos is not None:
                return f"{self.name}:{pos[0]}:{pos[1]}"
        return self.name


def _child(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        return next((v for k, v in node.value if getattr(k, "value", None) == key), None)
    return None


def _walk(node: yaml.Node, path: Loc, out: dict[Loc, tuple[int, int]]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = (*path, str(key.value))
            out[here] = (key.start_mark.line + 1, key.start_mark.column + 1)
            _walk(value, here, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            here = (*path, i)
            out[here] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(item, here, out)


_LEADING_PATH = re.compile(r"^([A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)*):?\s+(.*)$", re.S)


def split_path(text: str) -> tuple[Loc, str]:
    """A message that starts with its own key path (`warm_schedule[0].cron: bad field`) as
    (("warm_schedule", 0, "cron"), ": bad field"), so that the path joins the key's."""
    m = _LEADING_PATH.match(text)
    if m is None:
        return (), ": " + text
    loc = tuple(int(p) if p.isdigit() else p for p in re.findall(r"\w+", m.group(1)))
    rest = m.group(2)
    return loc, rest if rest.startswith(("must ", "is ", "(")) else ": " + rest


# ---- pydantic errors -> Problems ------------------------------------------------------------


def problems_from(
    exc: ValidationError, model: type[BaseModel], *, prefix: Loc = ()
) -> list[Problem]:
    """The problems of a ValidationError of `model`, whose input sits at `prefix` below the
    root `model` (e.g. a service's ServingSpec at ("services", 0) of the stack model)."""
    out: list[Problem] = []
    for err in exc.errors():
        loc = (*prefix, *_clean(err["loc"]))
        error = (err.get("ctx") or {}).get("error")
        if isinstance(error, RuleError):
            out += [
                Problem((*loc, *p.loc), p.text, p.given, p.fix, p.secret) for p in error.problems
            ]
            continue
        out.append(_problem(err, loc, model))
    return out


def _clean(loc: Iterable[int | str]) -> Loc:
    # Union members appear in the loc as tags ("str", "list[str]", "function-after[...]").
    return tuple(p for p in loc if isinstance(p, int) or not ("[" in p or p in _TAGS))


_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _problem(err: Mapping[str, Any], loc: Loc, model: type[BaseModel]) -> Problem:
    kind, given, msg = err["type"], err.get("input", NOT_SHOWN), str(err["msg"])
    if isinstance(given, dict):  # a whole map (a model-level rule's input): its path says it
        given = NOT_SHOWN
    info = field_at(model, loc)
    about = f" ({info.description})" if info is not None and info.description else ""
    if kind == "missing":
        return Problem(loc, "is not set" + about)
    if kind == "extra_forbidden":
        return Problem(loc, unknown_key_text(str(loc[-1]), allowed_keys(model, loc[:-1])))
    if kind in ("bool_type", "bool_parsing"):
        return Problem(loc, "must be true or false" + about, given)
    if kind == "literal_error":
        expected = str(err["ctx"]["expected"])
        close = difflib.get_close_matches(str(given), re.findall(r"'([^']*)'", expected), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return Problem(loc, f"must be one of {expected}{about}{hint}", given)
    if kind in _NUMBER_ERRORS:
        boolean = isinstance(given, str) and given.strip().lower() in ("true", "false")
        text = _number_text(info, kind, err.get("ctx") or {}) + (
            ", not a boolean" if boolean else ""
        )
        return Problem(loc, text + about, given)
    if kind in ("value_error", "assertion_error"):
        text = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        predicate = text.startswith((":", "must ", "is ", "names "))
        return Problem(loc, text if predicate else ": " + text, given)
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return Problem(loc, "must be a map" + about, given)
    if kind == "string_pattern_mismatch":
        return Problem(loc, f"must match {err['ctx']['pattern']}" + about, given)
    if kind == "too_short" and err["ctx"].get("min_length") == 1:
        return Problem(loc, "must not be empty" + about, given)
    if msg.startswith("Input should be "):
        what = msg.removeprefix("Input should be ")
        what = "a map" if what in ("an object", "a valid dictionary") else what
        return Problem(loc, "must be " + what + about, given)
    return Problem(loc, ": " + msg + about, given)


_NUMBER_ERRORS = {
    "int_type", "int_parsing", "int_from_float", "float_type", "float_parsing", "finite_number",
    "greater_than", "greater_than_equal", "less_than", "less_than_equal",
}  # fmt: skip


_SIGNS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _number_text(info: FieldInfo | None, kind: str, ctx: Mapping[str, Any]) -> str:
    whole = kind.startswith("int") or (info is not None and info.annotation is int)
    what = "a whole number" if whole else "a number"
    bounds = [f"{_SIGNS[k]} {v:g}" for k, v in ctx.items() if k in _SIGNS]  # the failed bound
    if not bounds and info is not None:  # a type error: every bound of the field
        bounds = [
            f"{sign} {getattr(meta, attr):g}"
            for meta in info.metadata
            for attr, sign in _SIGNS.items()
            if isinstance(meta, annotated_types.BaseMetadata)
            and getattr(meta, attr, None) is not None
        ]
    return f"must be {what}" + (f" {' and '.join(bounds)}" if bounds else "")


def did_you_mean(key: str, allowed: list[str]) -> str:
    """ "; did you mean X?" naming the allowed keys closest to `key`, or "" when none is."""
    close = difflib.get_close_matches(key, allowed, n=3, cutoff=0.6)
    close = close or [a for a in allowed if a.lower() == key.lower()]
    return "; did you mean " + ", ".join(map(repr, close)) + "?" if close else ""


def unknown_key_text(key: str, allowed: list[str] | None) -> str:
    """ "is not a known key; did you mean X?" from the keys allowed at that level only."""
    if allowed is None:
        return "is not a known key"
    hint = did_you_mean(key, allowed)
    if hint:
        return "is not a known key" + hint
    if len(allowed) <= _LIST_MAX:
        return f"is not a known key; the keys here are {', '.join(sorted(allowed))}"
    return "is not a known key (docs/program.md lists every key)"


# ---- walking a model: the field and the allowed keys at a path ------------------------------


class PassesTo:
    """Mixin for an input model whose unknown keys go on to another model (a service entry's
    keys beyond its own are ServingSpec's): both count as allowed keys at that level."""

    passes_to: ClassVar[type[BaseModel]]
    #: Keys of `passes_to` that a user may not set (the program fills them in).
    not_passed: ClassVar[tuple[str, ...]] = ()


def _models_in(annotation: Any) -> list[Any]:
    """The element types a path step may go into: list items, dict values, union members."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _models_in(a)]
    return [annotation]


def _step(annotation: Any, part: str | int) -> list[Any]:
    out: list[Any] = []
    for tp in _models_in(annotation):
        origin = typing.get_origin(tp)
        if isinstance(part, int) and origin in (list, tuple):
            out += [typing.get_args(tp)[0]]
        elif isinstance(part, str) and origin is dict:
            out += [typing.get_args(tp)[1]]
        elif isinstance(tp, type) and issubclass(tp, RootModel):
            out += _step(tp.model_fields["root"].annotation, part)
        elif isinstance(part, str) and isinstance(tp, type) and issubclass(tp, BaseModel):
            info = _fields(tp).get(part)
            if info is not None:
                out.append(info.annotation)
    return out


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """Input key (alias, else name) -> field, with the fields a PassesTo model hands on."""
    out = {info.alias or name: info for name, info in model.model_fields.items()}
    if issubclass(model, PassesTo):
        for name, info in model.passes_to.model_fields.items():
            if name not in model.not_passed:
                out.setdefault(info.alias or name, info)
    return out


def _annotations_at(model: type[BaseModel], loc: Loc) -> list[Any]:
    current: list[Any] = [model]
    for part in loc:
        current = [nxt for tp in current for nxt in _step(tp, part)]
    return current


def _models_at(model: type[BaseModel], loc: Loc) -> list[type[BaseModel]]:
    """The models the map at `loc` may be (a union can allow more than one)."""
    return [
        sub
        for tp in _annotations_at(model, loc)
        for sub in _models_in(tp)
        if isinstance(sub, type) and issubclass(sub, BaseModel)
    ]


def field_at(model: type[BaseModel], loc: Loc) -> FieldInfo | None:
    """The FieldInfo of the key at `loc` (a model field), or None."""
    if not loc or not isinstance(loc[-1], str):
        return None
    fields = (_fields(sub).get(loc[-1]) for sub in _models_at(model, loc[:-1]))
    return next((info for info in fields if info is not None), None)


def allowed_keys(model: type[BaseModel], loc: Loc) -> list[str] | None:
    """The keys a map at `loc` may hold, or None when it is not a model there."""
    models = _models_at(model, loc)
    return sorted(_fields(models[0])) if models else None


# ---- rendering --------------------------------------------------------------------------------


def _top(key: str, namespace: str) -> str:
    """A top key with its namespace (`modal-llm:services`); one that has a namespace of its own
    (`modal:serverUrl`) or is no key (`env MODAL_SERVER_URL`) keeps it."""
    return key if ":" in key or " " in key else f"{namespace}:{key}"


def path_text(loc: Loc) -> str:
    """`[0].scaling` for (0, "scaling"): a key path below its top key."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def _given(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _GIVEN_MAX else text[: _GIVEN_MAX - 5] + " ...>"


def problem_line(
    p: Problem,
    *,
    stack_file: StackFile,
    namespace: str,
    fix: Callable[[Problem], str] | None = None,
) -> str:
    """`file[:line:col]: key = given predicate. fix`, e.g. `Pulumi.dev.yaml:7:5:
    modal-llm:services[0].scaling ...`."""
    path = (_top(str(p.loc[0]), namespace), *p.loc[1:]) if p.loc else ()
    what = f"{path[0]}{path_text(path[1:])}" if path else namespace
    if p.given is not NOT_SHOWN:
        what += f" = {_given(p.given)}"
    sep = "" if p.text.startswith(":") else " "
    step = p.fix or (fix(p) if fix is not None else "")
    line = f"{stack_file.where(path)}: {what}{sep}{p.text}".rstrip(". ")
    line += "" if line.endswith(("?", "!")) else "."
    return line + (f" {step}" if step else "")


def config_error(
    problems: Iterable[Problem],
    *,
    stack_file: StackFile,
    namespace: str,
    fix: Callable[[Problem], str] | None = None,
) -> ConfigError:
    """One line per problem (`problem_line`), then what to do."""
    found = list(problems)
    lines = [problem_line(p, stack_file=stack_file, namespace=namespace, fix=fix) for p in found]
    lines.append(
        f"Nothing was applied: the program stops before it registers any resource. Fix "
        f"{stack_file.name} (every key: docs/program.md) and run again."
    )
    return ConfigError("\n".join(lines), found)
