"""One declaration per field of a dynamic resource; Args, props, check, diff and outputs follow.

A resource declares its fields once, as a class body (the `...Args` class its users build):

    class VolumeArgs(Schema):
        name: pulumi.Input[str] = updates(check=object_name("Volume"))
        environment: pulumi.Input[str] = replaces(check=environment_name_problems)
        adopt: pulumi.Input[bool] = flag(default=False)
        owner: str = owner()
        volume_id: str = output()
        adopted: bool = output()

Each field says what it is:

- `replaces(...)`: an input whose change replaces the object; `updates(...)`: one whose change
  updates it in place; `records(...)`: an input that is recorded but never compared by the
  declared diff (`in_outputs=False`: not echoed in the outputs either). A recorded input may
  say what its change does: `redeploys=True`, the object is made again from it (the
  provider's `extra_changes` tells how, e.g. from a digest); `noted=changed(old, new)`, the
  change is recorded by an update that leaves the object as it is. `flag(default=False)`: a
  true/false update input (absent = False; `noted=True`: a noted one instead); `owner()`:
  the ownership mark (`_base.owner_mark`) and `computed(initial=...)`: inputs the resource
  class fills in, not constructor arguments; `output()`: a value only the provider computes
  (`default`: what a state written before it existed stands for; `group`: a name for
  outputs that come together, e.g. what one call returns).
- `default` (or `default_factory`): the constructor default, also what `check` fills in when
  the engine sends the input as null (nothing is filled in for a default of None).
- `view`: how `diff` reads the value before comparing (see `_base.DiffSpec`); `unset_keeps`:
  an unset (null) new value keeps what the object has, so it is no change.
- `secret`: wrapped as a Pulumi secret in props and outputs (`rpc.wrap_rpc_secret`) and listed
  in `additional_secret_outputs`; a secret output that is None is left out.
- `check`: `value -> [problem, ...]`, each problem a CheckFailure on this field's property.
  Called with known values only (an unknown value, in preview, is checked at apply); a null
  value of a field with a default is not checked (it is filled in; `fill`: from the other
  inputs). `normalize`: what a known value becomes in the checked inputs (e.g. 365.0 days ->
  365). Checks of several inputs together are the class's `RULES`.

From that: `Schema` subclasses are keyword-only dataclasses (PEP 681 `dataclass_transform`, so
type checkers see the constructor; output and owner fields are not arguments); `SCHEMA` on the
class is a `ResourceSchema` with `props(...)` (what the resource registers), `check(...)`,
`diff` (a `DiffSpec`), `outputs(...)` and `read_inputs(...)`; `SchemaResource` is the resource
class base (provider, props and secret outputs from the schema); `Args.from_props(props)` is
the typed view a provider reads its props through (each field an attribute, read as
declared), and `outputs(props, recorded, ...)` carries the state's outputs over on an update
or a refresh, so no provider copies them by hand; `ModalProvider` takes its
`check` and `DIFF` from the provider's `SCHEMA` (see `_base.ModalProvider.__init_subclass__`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    Literal,
    TypedDict,
    TypeVar,
    Unpack,
    dataclass_transform,
)

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, DiffResult, ResourceProvider

from ._base import (
    DiffSpec,
    View,
    flag_view,
    is_unknown,
    owner_mark,
    owner_of,
    owner_problems,
    partial_diff,
    plain,
    secret_output,
)

Role = Literal["replace", "update", "record", "output"]
Check = Callable[[Any], Iterable[str]]
Initial = Callable[[str, str, "pulumi.ResourceOptions | None"], Any]
#: A check of several inputs together: (property, problem) pairs.
Rule = Callable[[Mapping[str, Any]], Iterable[tuple[str, str]]]
#: Whether a noted input changed: (old, new) -> bool, for known values.
Changed = Callable[[Any, Any], bool]
_KEY = "modal_llm_field"
#: The declared types a recorded output is read as (`Schema.from_props`), by the name its
#: annotation starts with; a null value reads as the type's empty value (an optional one,
#: `X | None`, is read as recorded).
_RECORDED_TYPES: dict[str, Callable[..., Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "dict": dict,
    "list": list,
}


@dataclass(frozen=True)
class FieldSpec:
    """What one field is (see the module docstring); `name` is filled in from the class body."""

    role: Role
    name: str = ""
    default: Any = None
    has_default: bool = False
    view: View | None = None
    unset_keeps: bool = False
    secret: bool = False
    check: Check | None = None
    normalize: Callable[[Any], Any] | None = None
    flag: bool = False
    #: Not a constructor argument: the props value is `initial(type_token, resource_name,
    #: opts)` (the resource's ResourceOptions, or None).
    initial: Initial | None = None
    #: What a null value becomes in the checked inputs, from all of them (None: stays null).
    fill: Callable[[Mapping[str, Any]], Any] | None = None
    #: Echoed in the outputs (an input only the provider reads is not, e.g. a credential).
    in_outputs: bool = True
    #: How the output reads the (checked) input; default: the input, its default when null.
    echo: Callable[[Mapping[str, Any]], Any] | None = None
    #: Left out of a refresh's inputs when null (the owner mark of a resource without one).
    omit_none: bool = False
    #: A recorded input from which the object is made again when it changes.
    redeploys: bool = False
    #: A recorded input whose change is recorded by an update that leaves the object as it is.
    noted: Changed | None = None
    #: Outputs that come together (e.g. what one call returns): `ResourceSchema.group`.
    group: str = ""
    #: The declared type (`_declared_type`): how a known input is echoed and how a recorded
    #: output is read (`recorded`).
    read_as: Callable[..., Any] | None = None

    @property
    def is_input(self) -> bool:
        return self.role != "output"

    def default_value(self) -> Any:
        return copy.deepcopy(self.default)

    def echoed(self, props: Mapping[str, Any]) -> Any:
        """This input as the outputs record it."""
        if self.echo is not None:
            return self.echo(props)
        value = props.get(self.name)
        if self.flag:
            return bool(value or False)
        if value is None:
            return self.default_value() if self.has_default else None
        if self.read_as is None or self.secret or is_unknown(value):
            return value
        return self.read_as(value)

    def recorded(self, props: Mapping[str, Any]) -> Any:
        """This field as `props` (a state's outputs) hold it, unwrapped: an input as
        `echoed`; an output as its declared type (`read_as`; null: the type's empty value, a
        secret's stays None), its `default` when the state was written before it existed."""
        if self.is_input:
            return plain(self.echoed(props))
        if self.name not in props and self.has_default:
            return self.default_value()
        value = plain(props.get(self.name))
        if self.read_as is None or (value is None and self.secret):
            return value
        return self.read_as(value) if value is not None else self.read_as()


def _field(
    spec: FieldSpec, *, init: bool, default: Any, default_factory: Callable[[], Any] | None
) -> Any:
    if default_factory is not None:
        spec = dataclasses.replace(spec, default=default_factory(), has_default=True)
        return dataclasses.field(default_factory=default_factory, init=init, metadata={_KEY: spec})
    if default is not dataclasses.MISSING:
        spec = dataclasses.replace(spec, default=default, has_default=True)
        return dataclasses.field(default=default, init=init, repr=init, metadata={_KEY: spec})
    if not init:
        return dataclasses.field(default=None, init=False, repr=False, metadata={_KEY: spec})
    return dataclasses.field(metadata={_KEY: spec})


class _Input(TypedDict, total=False):
    """What every declared input may say (see the module docstring). `default` and
    `default_factory` are read from the call by type checkers (PEP 681), as dataclasses'."""

    default: Any
    default_factory: Callable[[], Any]
    secret: bool
    check: Check | None
    normalize: Callable[[Any], Any] | None


class _Compared(_Input, total=False):
    view: View | None


class _Updated(_Compared, total=False):
    unset_keeps: bool


class _Recorded(_Input, total=False):
    fill: Callable[[Mapping[str, Any]], Any] | None
    echo: Callable[[Mapping[str, Any]], Any] | None
    in_outputs: bool
    redeploys: bool
    noted: Changed | None


def _input(role: Role, options: Mapping[str, Any]) -> Any:
    spec = {k: v for k, v in options.items() if k not in ("default", "default_factory")}
    return _field(
        FieldSpec(role, **spec),
        init=True,
        default=options.get("default", dataclasses.MISSING),
        default_factory=options.get("default_factory"),
    )


def replaces(**options: Unpack[_Compared]) -> Any:
    """An input whose change replaces the object."""
    return _input("replace", options)


def updates(**options: Unpack[_Updated]) -> Any:
    """An input whose change updates the object in place."""
    return _input("update", options)


def records(**options: Unpack[_Recorded]) -> Any:
    """An input that is recorded but never compared by the declared diff (`extra_changes`
    may read it; `redeploys`, `noted`: what its change does)."""
    return _input("record", options)


def _flag_changed(old: Any, new: Any) -> bool:
    return bool(new or False) != bool(old or False)


def flag(*, default: bool, noted: bool = False) -> Any:
    """A true/false input (absent, null and False compare equal) that updates in place, or
    with `noted=True` is recorded by an update that leaves the object as it is. `default` is
    spelled out (`flag(default=False)`): type checkers read it from the call."""
    if noted:
        spec = FieldSpec("record", flag=True, normalize=bool, noted=_flag_changed)
    else:
        spec = FieldSpec("update", flag=True, normalize=bool)
    return _field(spec, init=True, default=default, default_factory=None)


def computed(
    *,
    initial: Initial,
    check: Check | None = None,
    noted: Changed | None = None,
    init: Literal[False] = False,
) -> Any:
    """A recorded input the resource class computes (`initial`), not a constructor argument."""
    spec = FieldSpec("record", check=check, initial=initial, noted=noted)
    return _field(spec, init=init, default=None, default_factory=None)


def owner(*, init: Literal[False] = False) -> Any:
    """The ownership mark (`_base.owner_mark` of the type token and resource name): set by the
    resource class, recorded, never compared; an output of None when it is no mark."""
    spec = FieldSpec(
        "record",
        check=owner_problems,
        initial=lambda type_token, resource_name, _opts: owner_mark(type_token, resource_name),
        echo=lambda props: owner_of(props) or None,
        omit_none=True,
    )
    return _field(spec, init=init, default=None, default_factory=None)


def output(
    *,
    init: Literal[False] = False,
    secret: bool = False,
    default: Any = dataclasses.MISSING,
    group: str = "",
) -> Any:
    """A value only the provider computes (None in the props the resource registers);
    `default`: what a state written before it existed stands for (`FieldSpec.recorded`);
    `group`: outputs that come together (`ResourceSchema.group`)."""
    spec = FieldSpec("output", secret=secret, group=group)
    if default is not dataclasses.MISSING:
        spec = dataclasses.replace(spec, default=default, has_default=True)
    return _field(spec, init=init, default=dataclasses.MISSING, default_factory=None)


class ResourceSchema:
    """The fields of one resource, in declaration order, and what follows from them."""

    def __init__(
        self, owner_cls: type, fields: Iterable[FieldSpec], rules: Iterable[Rule] = ()
    ) -> None:
        self.owner_cls = owner_cls
        self.fields: tuple[FieldSpec, ...] = tuple(fields)
        self.rules = tuple(rules)
        self.by_name = {f.name: f for f in self.fields}
        self.secret_outputs = [f.name for f in self.fields if f.secret and f.in_outputs]
        compared = [f for f in self.fields if f.role in ("replace", "update")]
        views = {f.name: f.view for f in compared if f.view is not None}
        views.update({f.name: flag_view(f.name) for f in compared if f.flag})
        self.diff = DiffSpec(
            replace_on=tuple(f.name for f in self.fields if f.role == "replace"),
            update_on=tuple(f.name for f in self.fields if f.role == "update"),
            views=views,
            unset_keeps=tuple(f.name for f in self.fields if f.unset_keeps),
        )
        #: The recorded inputs from which the object is made again.
        self.redeploys = tuple(f.name for f in self.fields if f.redeploys)

    def group(self, name: str) -> tuple[str, ...]:
        """The outputs declared with `group=name`, in declaration order."""
        return tuple(f.name for f in self.fields if f.role == "output" and f.group == name)

    def noted_changed(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
        """Whether a `noted` input changed (an unknown new value counts as a change)."""
        return any(
            is_unknown(news.get(f.name)) or f.noted(olds.get(f.name), news.get(f.name))
            for f in self.fields
            if f.noted is not None
        )

    # ---- the program side --------------------------------------------------------------
    def props(
        self,
        args: Any,
        type_token: str,
        resource_name: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> dict[str, Any]:
        """What the resource registers: every input from `args` (secret ones wrapped in
        `pulumi.Output.secret` unless None), the computed ones (`initial`) and every output
        as None."""
        out: dict[str, Any] = {}
        for f in self.fields:
            if f.initial is not None:
                out[f.name] = f.initial(type_token, resource_name, opts)
            elif f.is_input:
                value = getattr(args, f.name)
                secret = f.secret and value is not None
                out[f.name] = pulumi.Output.secret(value) if secret else value
            else:
                out[f.name] = None
        return out

    # ---- the provider side -------------------------------------------------------------
    def check(self, news: Mapping[str, Any]) -> CheckResult:
        """Each input's problems as CheckFailures on its own property; the inputs with null
        defaults filled in and known values normalized. Never calls Modal."""
        failures: list[CheckFailure] = []
        checked = dict(news)
        for f in self.fields:
            if not f.is_input:
                continue
            value = news.get(f.name)
            if is_unknown(value):
                continue
            if value is None and f.fill is not None:
                filled = f.fill(news)
                if filled is not None:
                    checked[f.name] = filled
                continue
            if value is None and f.has_default:
                if f.default is not None:
                    checked[f.name] = f.default_value()
                continue
            if f.flag and not isinstance(value, bool):
                failures.append(CheckFailure(f.name, f"{f.name} must be true or false"))
            if f.check is not None:
                failures += [CheckFailure(f.name, problem) for problem in f.check(value)]
            if f.normalize is not None and f.name in checked:
                checked[f.name] = f.normalize(value)
        for rule in self.rules:
            failures += [CheckFailure(prop, problem) for prop, problem in rule(news)]
        return CheckResult(checked, failures)

    def outputs(
        self, props: Mapping[str, Any], recorded: Mapping[str, Any] | None = None, **computed: Any
    ) -> dict[str, Any]:
        """The outputs: each input as `echoed` from `props` unless given in `computed`,
        every output field from `computed`, or else carried over from `recorded` (the
        state's outputs, read as `FieldSpec.recorded`; without it every output is required);
        secret ones wrapped (a secret of None left out)."""
        if recorded is not None:
            kept = [f for f in self.fields if f.role == "output" and f.name not in computed]
            computed.update({f.name: f.recorded(recorded) for f in kept})
        stray = sorted(set(computed) - {f.name for f in self.fields if f.in_outputs})
        missing = [f.name for f in self.fields if not f.is_input and f.name not in computed]
        if stray or missing:
            raise TypeError(
                f"{self.owner_cls.__name__} outputs: unknown {stray}, missing {missing}"
                f" (declared: {list(self.by_name)})"
            )
        outs: dict[str, Any] = {}
        for f in self.fields:
            if not f.in_outputs:
                continue
            value = computed[f.name] if f.name in computed else f.echoed(props)
            if f.secret:
                if value is None:
                    continue
                value = secret_output(value)
            outs[f.name] = value
        return outs

    def read_inputs(self, outs: Mapping[str, Any], props: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs a refresh reports: each input as the outputs hold it, except a secret
        or `unset_keeps` input the state did not set, and a null `omit_none` one."""
        inputs: dict[str, Any] = {}
        for f in self.fields:
            if not f.is_input or f.name not in outs:
                continue
            if (f.secret or f.unset_keeps) and props.get(f.name) is None:
                continue
            if f.omit_none and outs[f.name] is None:
                continue
            inputs[f.name] = outs[f.name]
        return inputs


def _declared_type(annotation: Any) -> Callable[..., Any] | None:
    """What a field's annotation reads its values as (`_RECORDED_TYPES`): `int`, `list[str]`,
    `pulumi.Input[float]`, ...; None for an optional (`X | None`) or any other type."""
    if not isinstance(annotation, str) or "None" in annotation:
        return None
    inner = annotation.removeprefix("pulumi.Input[").split("[", 1)[0].split(" ", 1)[0]
    return _RECORDED_TYPES.get(inner.rstrip("]"))


@dataclass_transform(
    kw_only_default=True,
    field_specifiers=(replaces, updates, records, flag, computed, owner, output),
)
class Schema:
    """Base of a resource's field declaration (its `...Args`): see the module docstring.
    `RULES`: checks of several inputs together (e.g. a digest that must match its spec)."""

    SCHEMA: ClassVar[ResourceSchema]
    RULES: ClassVar[tuple[Rule, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclass(kw_only=True)(cls)
        specs = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            spec = f.metadata.get(_KEY)
            if spec is None:
                raise TypeError(
                    f"{cls.__name__}.{f.name}: declare it with replaces(), updates(),"
                    " records(), flag(default=...), computed(), owner() or output()"
                )
            specs.append(dataclasses.replace(spec, name=f.name, read_as=_declared_type(f.type)))
        cls.SCHEMA = ResourceSchema(cls, specs, cls.RULES)

    @classmethod
    def from_props(cls: type[S], props: Mapping[str, Any]) -> S:
        """`props` (a provider's inputs or a state's outputs) as this class's attributes, each
        field read as `FieldSpec.recorded` (its default when null, secrets unwrapped, an
        output as its declared type), so a provider never spells a field name as a string."""
        view = object.__new__(cls)
        for f in cls.SCHEMA.fields:
            setattr(view, f.name, f.recorded(props))
        return view


A = TypeVar("A", bound=Schema)
S = TypeVar("S", bound=Schema)


class SchemaProvider(ResourceProvider):
    """A provider whose `check` and `diff` are its `SCHEMA`'s, for providers that do not talk
    to Modal (`ModalProvider` has its own, with `extra_changes`)."""

    SCHEMA: ClassVar[ResourceSchema]

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return type(self).SCHEMA.check(news)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return partial_diff(olds, news, type(self).SCHEMA.diff)


class SchemaResource(pulumi.dynamic.Resource, Generic[A]):
    """A dynamic resource whose props, provider and secret outputs come from its schema.

    Subclasses set `PROVIDER` (the provider class, whose `SCHEMA` and `type_token` are used).
    Every declared field is an output attribute (the SDK sets one per props key,
    `pulumi.runtime.rpc.transfer_properties`); `__getattr__` only types them for mypy."""

    PROVIDER: ClassVar[type[ResourceProvider]]

    def __init__(
        self, resource_name: str, args: A, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        provider = type(self).PROVIDER()
        schema: ResourceSchema = type(args).SCHEMA
        type_token = str(getattr(provider, "type_token", ""))
        props = schema.props(args, type_token, resource_name, opts)
        if schema.secret_outputs:
            opts = pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(additional_secret_outputs=schema.secret_outputs)
            )
        super().__init__(provider, resource_name, props, opts)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> pulumi.Output[Any]: ...


__all__ = [
    "FieldSpec",
    "ResourceSchema",
    "Rule",
    "Schema",
    "SchemaProvider",
    "SchemaResource",
    "computed",
    "flag",
    "output",
    "owner",
    "records",
    "replaces",
    "updates",
]
