"""The pinned engines' own flag lists, and how each engine's parser reads a flag.

One generated module per pinned engine release (`vllm_0_33_0.py`, `sglang_0_5_23.py`), written
by scripts/record_engine_flags.py from the engine's real argument parser: `ACTIONS` holds one
entry per parser action, its option strings space-separated (aliases and `--no-...` negations
share an entry). It is the only copy of the list; the spec checks `extra_args` against it at
`pulumi preview` (and again in the container), and the tests check every rendered flag.

Both parsers are argparse with `allow_abbrev=True`, so a unique prefix (`--max-model`,
`--mem-fraction`) selects the full option; vLLM also turns `_` into `-` in flag names
(`--max_model_len`), reads `--key.sub value` as `--key '{"sub": value}'`, and `-O3` as
`--optimization-level 3`. `parser_name` applies those rewrites; `FlagList.resolve` then finds
the option exactly as written or the options it abbreviates.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class FlagList:
    """The option strings of one engine release's server parser, grouped by action."""

    engine: str
    version: str
    source: str  # the file the list lives in, for error messages
    groups: dict[str, tuple[str, ...]]  # option string -> all option strings of its action

    @property
    def options(self) -> frozenset[str]:
        """Every option string the parser knows."""
        return frozenset(self.groups)

    def aliases(self, option: str) -> tuple[str, ...]:
        """Every option string that sets the same thing as `option` (itself included)."""
        return self.groups[option]

    def resolve(self, name: str) -> tuple[str | None, list[str]]:
        """(the option `name` is, None) or (None, the options it abbreviates, maybe none).

        Mirrors argparse: an exact option string wins; otherwise a long name matches every
        option starting with it, a short one also the 2-character option it starts with
        (`-qfp8` is `-q fp8`).
        """
        if name in self.groups:
            return name, []
        if name.startswith("--"):
            matches = {o for o in self.groups if o.startswith(name)}
        else:
            matches = {o for o in self.groups if o == name[:2] or o.startswith(name)}
        return None, sorted(matches)


def module_name(engine: str, version: str) -> str:
    """The module that holds `engine`==`version`'s list (dots of the version become `_`)."""
    return f"{__name__}.{engine}_{version.replace('.', '_')}"


@functools.cache
def flag_list(engine: str, version: str) -> FlagList:
    """The recorded flag list of `engine`==`version`; LookupError says how to record it."""
    name = module_name(engine, version)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError:
        raise LookupError(
            f"no recorded flag list for {engine}=={version} (module {name}); record it with "
            f"`python scripts/record_engine_flags.py {engine} > "
            f"{name.replace('.', '/')}.py` in a venv where {engine}=={version} is installed"
        ) from None
    if (engine, version) != (module.ENGINE, module.VERSION):
        raise LookupError(
            f"{name} records {module.ENGINE}=={module.VERSION}, not {engine}=={version}; "
            "re-record it with scripts/record_engine_flags.py"
        )
    groups: dict[str, tuple[str, ...]] = {}
    for entry in module.ACTIONS:
        options = tuple(entry.split())
        for option in options:
            groups[option] = options
    return FlagList(engine, version, name.replace(".", "/") + ".py", groups)


def parser_name(engine: str, token: str) -> str:
    """The option name the engine's parser looks up for an argv token (before abbreviation)."""
    name = token.split("=", 1)[0]
    if engine != "vllm":
        return name
    # vLLM's FlexibleArgumentParser.parse_args, in the same order:
    if name.startswith("--"):
        head = name.split(".", 1)[0]  # `--hf-overrides.key v` sets a key of --hf-overrides
        return "--" + head[2:].replace("_", "-")
    if token.startswith("-O"):
        return "--optimization-level"  # -O3, -O=3, -O 3
    return name.split(".", 1)[0]  # `-cc.mode 3` is --compilation-config's alias -cc


__all__ = ["FlagList", "flag_list", "module_name", "parser_name"]
