"""The structured-output constraint a request asks for, checked at the door.

A request names at most one of: OpenAI's `response_format` (`json_object`, `json_schema`),
vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`), or the
older top-level `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. Two at once
is a 400 naming both. The one given becomes an `OutputConstraint` (kind + text) that the
worker compiles; it is compiled here first (`GrammarCompiler.check`, cached), so an invalid
schema, regex or grammar is a 400 with the grammar engine's message (escaped, bounded)
before any worker sees it.

JSON options (`structured_outputs.disable_any_whitespace`, `disable_additional_properties`,
`whitespace_pattern`, and the older `guided_whitespace_pattern`) apply to a JSON constraint
from any of the fields; they travel inside the schema's `x-guidance` object, which
llguidance reads. Without them JSON has no free whitespace (see `structured_output.py`).
`guided_decoding_backend` is accepted and ignored: a backend's name does not change what the
output must match, and pdserve has one grammar engine. Structural tags are refused.
"""

from __future__ import annotations

import json
from typing import Any

from pdserve.engine.sampling_params import OutputConstraint
from pdserve.engine.structured_output import ConstraintError, GrammarCompiler
from pdserve.server.body import MAX_JSON_DEPTH, check_structure, too_long_integer
from pdserve.server.errors import APIError
from pdserve.server.schemas import ChatCompletionRequest, CompletionRequest

_SUBSCHEMAS = ("additionalProperties", "unevaluatedProperties", "propertyNames", "contains",
               "additionalItems", "unevaluatedItems", "not", "if", "then", "else", "items",
               "prefixItems", "allOf", "anyOf", "oneOf")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                "dependentSchemas")


def _no_additional_properties(schema: Any) -> None:
    """vLLM's `disable_additional_properties`: every object schema that lists properties and
    says nothing of others gets `additionalProperties: false` (in place)."""
    if isinstance(schema, list):
        for item in schema:
            _no_additional_properties(item)
        return
    if not isinstance(schema, dict):
        return
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for sub in schema[key].values():
                _no_additional_properties(sub)
    for key in _SUBSCHEMAS:
        if isinstance(schema.get(key), dict | list):
            _no_additional_properties(schema[key])
    if "additionalProperties" not in schema and (isinstance(schema.get("properties"), dict)
                                                 or isinstance(schema.get("patternProperties"),
                                                               dict)):
        schema["additionalProperties"] = False


def _schema_object(value: dict[str, Any] | str, param: str) -> dict[str, Any]:
    """A schema given as a JSON text is held to the body's own rules (nesting, Unicode):
    it did not pass through them as JSON."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except RecursionError as err:
            raise APIError(400, f"{param}: nests deeper than {MAX_JSON_DEPTH} levels",
                           param) from err
        except json.JSONDecodeError as err:
            raise APIError(400, f"{param}: not valid JSON: {err}", param) from err
        except ValueError as err:  # int() refused a literal past its digit limit
            raise APIError(400, f"{param}: {too_long_integer()}", param) from err
        try:
            check_structure(value, what=param)
        except APIError as err:
            raise APIError(400, err.message, param) from err
    if not isinstance(value, dict):
        raise APIError(400, f"{param}: a JSON Schema must be an object", param)
    return value


def _json_text(schema: dict[str, Any], body: CompletionRequest | ChatCompletionRequest,
               param: str) -> str:
    options = body.structured_outputs
    schema = json.loads(json.dumps(schema))  # a copy to change
    if options is not None and options.disable_additional_properties:
        _no_additional_properties(schema)
    guidance: dict[str, Any] = {}
    pattern = (options.whitespace_pattern if options is not None else None) or \
        body.guided_whitespace_pattern
    if pattern is not None:
        guidance.update(whitespace_flexible=True, whitespace_pattern=pattern)
    elif options is not None and options.disable_any_whitespace is False:
        guidance["whitespace_flexible"] = True
    if guidance:
        given = schema.get("x-guidance")
        if given is not None and not isinstance(given, dict):
            raise APIError(400, f"{param}.x-guidance: must be an object", param)
        schema["x-guidance"] = {**(given or {}), **guidance}
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def requested_constraint(body: CompletionRequest | ChatCompletionRequest
                         ) -> tuple[str, OutputConstraint] | None:
    """(the field that named it, the constraint), or None; a 400 for two at once."""
    given: list[tuple[str, str, Any]] = []  # (param, kind, value)
    response_format = body.response_format
    if response_format is not None and response_format.type != "text":
        if response_format.type == "structural_tag":
            raise APIError(400, "response_format.type: 'structural_tag' is not supported",
                           "response_format.type")
        if response_format.type == "json_object":
            given.append(("response_format", "json", {"type": "object"}))
        else:
            form = response_format.json_schema
            if form is None or form.json_schema is None:
                raise APIError(400, "response_format.json_schema.schema: required for type "
                               "'json_schema'", "response_format.json_schema.schema")
            given.append(("response_format", "json", form.json_schema))
    options = body.structured_outputs
    if options is not None:
        if options.structural_tag is not None:
            raise APIError(400, "structured_outputs.structural_tag: not supported",
                           "structured_outputs.structural_tag")
        for name, kind, value in (("json", "json", options.json_),
                                  ("regex", "regex", options.regex),
                                  ("choice", "choice", options.choice),
                                  ("grammar", "grammar", options.grammar)):
            if value is not None:
                given.append((f"structured_outputs.{name}", kind, value))
        if options.json_object:
            given.append(("structured_outputs.json_object", "json", {"type": "object"}))
    if body.structural_tag is not None:
        raise APIError(400, "structural_tag: not supported", "structural_tag")
    for name, kind in (("guided_json", "json"), ("guided_regex", "regex"),
                       ("guided_choice", "choice"), ("guided_grammar", "grammar")):
        value = getattr(body, name)
        if value is not None:
            given.append((name, kind, value))
    if not given:
        return None
    if len(given) > 1:
        first, second = given[0][0], given[1][0]
        raise APIError(400, f"{second}: at most one structured-output constraint per request, "
                       f"got {first} and {second}", second)
    param, kind, value = given[0]
    if kind == "json":
        text = _json_text(_schema_object(value, param), body, param)
    elif kind == "choice":
        if not value:
            raise APIError(400, f"{param}: the list of choices is empty", param)
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = value
    return param, OutputConstraint(kind, text)


def checked_constraint(body: CompletionRequest | ChatCompletionRequest,
                       grammars: GrammarCompiler) -> OutputConstraint | None:
    """The request's constraint, compiled once here so that an invalid one is a 400."""
    requested = requested_constraint(body)
    if requested is None:
        return None
    param, constraint = requested
    try:
        grammars.check(constraint)
    except ConstraintError as err:
        raise APIError(400, f"{param}: {err}", param) from err
    return constraint
