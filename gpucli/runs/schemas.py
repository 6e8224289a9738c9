"""JSON Schemas (draft 2020-12) for ``task.yaml`` and ``run.yaml``, generated from the dataclasses that
read them (:class:`gpucli.runs.task.Task` with its key table, and the trainer's
:class:`trainer.spec.config.Config`), so an editor's YAML support can check and complete both files.

The published copies are ``gpucli/schemas/task.schema.json`` and ``run.schema.json``; a test keeps
them equal to what this module generates (``gpucli schema task > gpucli/schemas/task.schema.json``).
In an editor, point yaml-language-server at them::

    # yaml-language-server: $schema=<path or URL of task.schema.json>
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from gpucli.runs import task as t
from gpucli.runs.userconfig import PROVIDERS
from trainer.spec.config import ATTENTION_KERNELS, OPTIMIZERS, TRACKERS, Config

PUBLISHED = Path(__file__).resolve().parents[1] / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
_ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"


def _field_docs(cls: type) -> dict[str, str]:
    """The string literal under each field of a dataclass (its attribute docstring)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for a, b in zip(body, body[1:], strict=False):
        if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def _type_schema(hint: Any, loose: bool = False) -> dict[str, Any]:
    """``loose``: the trainer config's loader, which takes a number or a boolean for a string (YAML reads
    ``compile: off`` as false) and one item for a list."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [_type_schema(a, loose) for a in args if a is not type(None)]
        schema = inner[0] if len(inner) == 1 else {"anyOf": inner}
        if type(None) in args:
            return {"anyOf": [schema, {"type": "null"}]}
        return schema
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return dataclass_schema(hint, loose)
    if origin in (list, tuple):
        item = _type_schema(args[0], loose) if args else {}
        return {"anyOf": [{"type": "array", "items": item}, item]} if loose else {"type": "array", "items": item}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if hint is str and loose:
        return {"type": ["string", "number", "boolean"]}
    if hint in simple:
        return {"type": simple[hint]}
    return {}


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    return value


def dataclass_schema(cls: type, loose: bool = False) -> dict[str, Any]:
    """An object with the dataclass's fields: type, default and documentation; nothing else allowed."""
    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    props: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        schema = _type_schema(hints[f.name], loose)
        if f.default is not dataclasses.MISSING and not dataclasses.is_dataclass(f.default):
            schema["default"] = _jsonable(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            value = f.default_factory()  # type: ignore[misc]
            if not dataclasses.is_dataclass(value):
                schema["default"] = value
        choices = _choices().get((cls.__name__, f.name))
        if choices:
            schema = {"enum": list(choices), **{k: v for k, v in schema.items() if k != "type"}}
        if f.name in docs:
            schema["description"] = docs[f.name]
        props[f.name] = schema
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):
        out["description"] = " ".join(cls.__doc__.split())
    return out


def _choices() -> dict[tuple[str, str], tuple[str, ...]]:
    """Fields whose loader takes one of a fixed set of words."""
    return {("TrackingConfig", "backend"): TRACKERS, ("TrainingConfig", "optimizer"): OPTIMIZERS,
            ("HardwareConfig", "attention"): ATTENTION_KERNELS}


def run_schema() -> dict[str, Any]:
    body = dataclass_schema(Config, loose=True)
    body.pop("description", None)
    return {"$schema": DRAFT, "title": "gpucli run.yaml",
            "description": "The bundled trainer's configuration (python -m trainer.train --config run.yaml); "
                           "every key is optional.", **body}


def task_schema() -> dict[str, Any]:
    hints = typing.get_type_hints(t.Task)
    fields = {f.name: f for f in dataclasses.fields(t.Task)}
    positive = {"type": "number", "exclusiveMinimum": 0}
    props: dict[str, Any] = {}
    for key in t.KEYS:
        if key == "limits":
            props[key] = {"type": "object", "additionalProperties": False,
                          "properties": {k: {"anyOf": [positive, {"type": "null"}]} for k in t.LIMIT_KEYS}}
        elif key == "grace":
            props[key] = positive
        elif key == "env":
            props[key] = {"type": "object", "propertyNames": {"pattern": _ENV_NAME, "not": {"pattern": "^GPUCLI_"}},
                          "additionalProperties": {"type": ["string", "number"]}}
        elif key == "sweep":
            scalar = {"type": ["string", "number"]}
            props[key] = {"type": "object", "propertyNames": {"pattern": _ENV_NAME, "not": {"pattern": "^GPUCLI_"}},
                          "additionalProperties": {"anyOf": [scalar, {"type": "array", "items": scalar, "minItems": 1}]}}
        elif key == "env_from_local":
            props[key] = {"type": "array", "items": {"type": "string", "pattern": _ENV_NAME}}
        elif key == "provider":
            one = "(" + "|".join(PROVIDERS) + ")"  # a provider, any, or a list of them (runpod,vast)
            props[key] = {"anyOf": [{"enum": [*PROVIDERS, "any"]}, {"type": "string", "pattern": f"^{one}(,{one})+$"}]}
        elif key == "code" or key == "data":
            props[key] = {"type": "string", "minLength": 1}
        else:
            schema = _type_schema(hints[key])
            if schema.get("anyOf"):  # optional in the dataclass, a value when given in the file
                schema = schema["anyOf"][0]
            if schema.get("type") == "string":
                schema["minLength"] = 1
            default = fields[key].default
            if default is not dataclasses.MISSING and default is not None:
                schema["default"] = default
            props[key] = schema
    return {"$schema": DRAFT, "title": "gpucli task.yaml",
            "description": "Your own code's launch: gpucli launch task.yaml (command-line options override it).",
            "type": "object", "required": ["run"], "properties": props, "additionalProperties": False}


SCHEMAS = {"task": task_schema, "run": run_schema}


def render(kind: str) -> str:
    return json.dumps(SCHEMAS[kind](), indent=2) + "\n"
