"""Typed settings: each component declares its settings once, as a dataclass next to its code.

A field's default is the one default; its metadata carries the allowed range or choices and a
line of help. `parse` turns a plain dict (one config node, e.g. ``scheduler``) into an instance,
checking names, types and ranges, and naming the setting as it is typed on the command line in
every error. Nothing is coerced: ``512.5`` for an int, ``"1"`` for a number or ``1`` for a bool
is an error, not a guess.

`plain` is the one conversion of a config node (an OmegaConf node or a dict) to plain data, and
`missing` the one test for a value not given (None or NaN); they live here, at the bottom layer,
because every layer uses them.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import MISSING, field

__all__ = ["ConfigError", "setting", "parse", "describe", "to_dict", "plain", "missing"]


class ConfigError(ValueError):
    """A setting that cannot be used as given; the message names it."""


def setting(default=MISSING, *, ge=None, gt=None, le=None, lt=None, choices=None,
            help: str = ""):
    """A dataclass field with its allowed range (ge/gt/le/lt), or choices, and a help line."""
    meta = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt),
                              ("choices", tuple(choices) if choices is not None else None),
                              ("help", help)) if v is not None and v != ""}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _type_name(tp) -> str:
    if tp is type(None):
        return "null"
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if typing.get_origin(tp) in (list, tuple):
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if typing.get_origin(tp) is dict or tp is dict:
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _check_type(tp, value, where: str):
    """`value` if it is of type `tp` (ints are accepted as floats); else ConfigError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for a in args:
            try:
                return _check_type(a, value, where)
            except ConfigError:
                pass
    elif tp is type(None):
        if value is None:
            return None
    elif tp is typing.Any:
        return value
    elif origin is typing.Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
    elif origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            return [_check_type(args[0], v, f"{where}[{i}]") if args else v
                    for i, v in enumerate(value)]
    elif origin is dict or tp is dict:
        if isinstance(value, dict):
            return dict(value)
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:   # an int beyond any float: a typo, not a number to round
                number = math.inf
            if not math.isfinite(number):
                raise ConfigError(f"{where}={value!r}: must be a finite number")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"{where}: settings of type {tp!r} are not supported")
    raise ConfigError(f"{where}={value!r}: must be {_type_name(tp)}")


def _check_range(value, meta: dict, where: str) -> None:
    if value is None or isinstance(value, (list, dict, bool)):
        return
    bounds = (("ge", ">=", lambda v, b: v >= b), ("gt", ">", lambda v, b: v > b),
              ("le", "<=", lambda v, b: v <= b), ("lt", "<", lambda v, b: v < b))
    for key, sym, ok in bounds:
        if key in meta and not ok(value, meta[key]):
            raise ConfigError(f"{where}={value!r}: must be {sym} {meta[key]} "
                              f"(allowed: {_range_text(meta)})")
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{where}={value!r}: must be one of {', '.join(map(str, meta['choices']))}")


def _range_text(meta: dict) -> str:
    lo = (f"[{meta['ge']}" if "ge" in meta else f"({meta['gt']}" if "gt" in meta else "(-inf")
    hi = (f"{meta['le']}]" if "le" in meta else f"{meta['lt']})" if "lt" in meta else "inf)")
    return f"{lo}, {hi}"


def parse(cls, values, where: str, component: str | None = None):
    """An instance of the settings dataclass `cls` from the mapping `values`.

    `where` is the config path of the node (``scheduler``), used to name settings in errors;
    `component` names what reads them (``policy 'sarathi'``). Unknown keys, wrong types and
    out-of-range values raise ConfigError; then the class's own `validate()` (cross-setting
    rules), if it has one, runs: its ValueError messages start with the setting's name, which
    gets the node's path in front."""
    values = dict(values or {})

    def key(name: str) -> str:
        return f"{where}.{name}" if where else name
    # internal fields are filled by code (e.g. a nested component's settings), never by users
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        who = component or cls.__name__
        raise ConfigError(
            f"{key(unknown[0])}: not a setting of {who}"
            + (f" (nor are {', '.join(unknown[1:])})" if len(unknown) > 1 else "")
            + f"; its settings are: {', '.join(sorted(fields)) or '(none)'}")
    hints = _hints(cls)
    kw = {}
    for name, f in fields.items():
        if name not in values:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ConfigError(f"{key(name)}: required, and not set")
            continue
        v = _check_type(hints[name], values[name], key(name))
        _check_range(v, f.metadata, key(name))
        kw[name] = v
    obj = cls(**kw)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(key(str(e))) from None
    return obj


def split_node(values: dict, own: set[str], theirs: set[str], where: str, owner: str,
               plugin: str, listed: list[tuple[str, set[str]]]) -> tuple[dict, dict]:
    """One flat node that holds a component's settings and its plug-in's (the sim executor and
    its cost model, a policy and its budget controller): (the component's values, the
    plug-in's); a key neither declares is a ConfigError that lists the `listed` settings."""
    unknown = sorted(set(values) - own - theirs)
    if unknown:
        names = "; ".join(f"the {label}'s: {', '.join(sorted(keys)) or '(none)'}"
                          for label, keys in listed)
        raise ConfigError(f"{where}.{unknown[0]}: not a setting of {owner} nor of its {plugin}; "
                          f"{names}")
    return ({k: v for k, v in values.items() if k in own},
            {k: v for k, v in values.items() if k in theirs})


def refuse_renamed(values: dict, renamed: dict[str, str], where: str) -> None:
    """A setting under an old name is a ConfigError naming the new one (`renamed`: old name ->
    the new name, with what it is), not an unknown key nor a silent alias."""
    for old, new in renamed.items():
        if old in values:
            raise ConfigError(renamed_message(where, old, new))


def renamed_message(where: str, old: str, new: str) -> str:
    """The error for setting `old` of node `where`, renamed `new` (the CLI's too)."""
    return f"{where}.{old}: renamed; set {where}.{new}"


def plain(cfg):
    """A plain dict/list from an OmegaConf config, a copy of a dict, {} for None; any other
    value (an int length spec, a string) unchanged. omegaconf is imported only when needed."""
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return dict(cfg)
    if type(cfg).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def missing(value) -> bool:
    """A value not given: None (a config's null, a JSON null) or NaN (an empty cell of a frame)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def to_dict(obj) -> dict:
    return dataclasses.asdict(obj)


def describe(cls) -> list[tuple[str, str, object, str]]:
    """(name, type, default, help with range) for each setting: for docs and error messages."""
    hints = _hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else "required")
        extra = f.metadata.get("help", "")
        if any(k in f.metadata for k in ("ge", "gt", "le", "lt")):
            extra += f" {_range_text(f.metadata)}"
        if "choices" in f.metadata:
            extra += f" one of {', '.join(map(str, f.metadata['choices']))}"
        rows.append((f.name, _type_name(hints[f.name]), default, extra.strip()))
    return rows
