"""The one base of rolloutd's models that cross a process boundary: Temporal payloads (every
workflow's, activity's, signal's, update's and query's input and output), the blob store's
records and what the trainer client reads.

Unknown fields are ignored, so old and new workers interoperate while a field is added or
retired (Temporal's advice for payload evolution: docs.temporal.io, "Workflow and activity
input evolution"); every new field gets a default for the same reason. A field is documented
in one way only: ``Field(description=...)``, which the JSON schema and the generated docs read.

What a user writes is checked strictly before it becomes such a model: :func:`validate_strict`
refuses unknown fields by name (the models themselves stay lenient for old and new workers);
:func:`read_document` reads it from a JSON or TOML file.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError


class Payload(BaseModel):
    """Base of every model that crosses a process boundary: unknown fields are ignored,
    fields may be given by name or alias."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


M = TypeVar("M", bound=BaseModel)
#: unknown fields found: (location, value, the model that lacks the field)
_Found = list[tuple[tuple[str | int, ...], Any, type[BaseModel]]]


def read_document(path: Path) -> dict[str, Any]:
    """The object a user wrote in a file: TOML for a ``.toml`` file (Python's ``tomllib``),
    else JSON. Check it with :func:`validate_strict` next.

    Raises:
        ValueError: the file is not TOML or JSON, or its JSON is not an object (the message
            names the file and where).
        OSError: the file cannot be read.
    """
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not TOML: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON object is needed, not {type(data).__name__}")
    return data


def unknown_fields(model: type[BaseModel], data: Any) -> list[tuple[tuple[str | int, ...], Any]]:
    """The fields of ``data`` that ``model`` does not have, at any depth, with their values.

    What a user writes (a REST body, a task file, a buffer source's row) is checked with it
    before it becomes a payload model, which would ignore such a field silently (a misspelt
    ``num_sample: 8`` would run one sample).

    Args:
        model: the model ``data`` is meant for (nested models, lists, dicts of models and
            unions of models are followed; a union picks the member whose ``type`` literal
            matches, else the one with the fewest unknown fields).
        data: the parsed JSON object.

    Returns:
        ``(location, value)`` of each unknown field, in order, location as pydantic's ``loc``.
    """
    return [(loc, value) for loc, value, _ in _unknown_in_model(model, data, ())]


def validate_strict(model: type[M], data: Any) -> M:
    """``model`` from what a user wrote, refusing unknown fields by name.

    Raises:
        pydantic.ValidationError: the model's own errors and one ``unknown_field`` error per
            field the model does not have (its ``loc`` is the field's path; the message says
            the nearest known name).
    """
    unknown = _unknown_in_model(model, data, ())
    errors: list[Any] = []
    try:
        validated = model.model_validate(data)
    except ValidationError as e:
        errors = [
            {k: v for k, v in err.items() if k in ("type", "loc", "input", "ctx")}
            for err in e.errors()
        ]
        if not unknown:
            raise
    if not unknown:
        return validated
    for loc, value, owner in unknown:
        errors.append(
            {
                "type": PydanticCustomError(
                    "unknown_field", "{hint}", {"hint": _hint(owner, str(loc[-1]))}
                ),
                "loc": loc,
                "input": value,
            }
        )
    raise ValidationError.from_exception_data(model.__name__, errors)


def _hint(owner: type[BaseModel], name: str) -> str:
    """``unknown field 'x'`` and, when one is close, the known name meant."""
    known = sorted(_known_names(owner))
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    hint = f"unknown field {name!r}"
    return hint + (f"; did you mean {close[0]!r}?" if close else "")


def _known_names(model: type[BaseModel]) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        names[name] = field.annotation
        if isinstance(field.alias, str):
            names[field.alias] = field.annotation
        if isinstance(field.validation_alias, str):
            names[field.validation_alias] = field.annotation
    return names


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a union (or a single type) admits."""
    if get_origin(annotation) is Annotated:
        return _models_in(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _pick(models: list[type[BaseModel]], data: Any) -> type[BaseModel] | None:
    if not models or not isinstance(data, Mapping):
        return None
    kind = data.get("type")
    tagged = [
        m
        for m in models
        if "type" in m.model_fields and kind in get_args(m.model_fields["type"].annotation)
    ]
    candidates = tagged or models
    return min(candidates, key=lambda m: len(_unknown_in_model(m, data, ())))


def _unknown_in_model(model: type[BaseModel], data: Any, loc: tuple[str | int, ...]) -> _Found:
    if not isinstance(data, Mapping) or model.model_config.get("extra") == "allow":
        return []
    known = _known_names(model)
    found: _Found = []
    for key, value in data.items():
        if key not in known:
            found.append(((*loc, key), value, model))
        else:
            found.extend(_unknown_in(known[key], value, (*loc, key)))
    return found


def _unknown_in(annotation: Any, value: Any, loc: tuple[str | int, ...]) -> _Found:
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (Union, UnionType):
        members = [a for a in args if a is not type(None)]
        sequences = [a for a in members if get_origin(a) in (list, tuple, set, frozenset)]
        mappings = [a for a in members if get_origin(a) is dict]
        if isinstance(value, list) and sequences:
            return _unknown_in(sequences[0], value, loc)
        if isinstance(value, Mapping) and mappings and not _models_in(annotation):
            return _unknown_in(mappings[0], value, loc)
        model = _pick(_models_in(annotation), value)
        return _unknown_in_model(model, value, loc) if model is not None else []
    if origin in (list, tuple, set, frozenset) and args and isinstance(value, list):
        return [
            found for i, item in enumerate(value) for found in _unknown_in(args[0], item, (*loc, i))
        ]
    if origin is dict and len(args) == 2 and isinstance(value, Mapping):
        return [found for k, v in value.items() for found in _unknown_in(args[1], v, (*loc, k))]
    model = _pick(_models_in(annotation), value)
    return _unknown_in_model(model, value, loc) if model is not None else []
