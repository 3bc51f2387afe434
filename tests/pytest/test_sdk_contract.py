"""The Python SDK against the OpenAPI document: no field or route may drift.

``trainyard.models`` declares, per component schema, the fields the SDK
reads and writes with their Python types, and the (method, path) of every
call. These tests check each declaration against ``openapi/openapi.json``
(the document the server serves): the field exists with a compatible type,
a field the SDK counts on is required there, a request the SDK builds
carries every required field, every route exists — and the client's source
calls no route missing from the list. No server is needed.
"""

import json
import re
import typing
from pathlib import Path

import pytest

import trainyard
from trainyard import models

ROOT = Path(__file__).resolve().parents[2]
DOC = json.loads((ROOT / "openapi" / "openapi.json").read_text())
COMPONENTS = DOC["components"]["schemas"]

#: Schemas of bodies the SDK sends: it must write each of their required fields.
REQUESTS = {models.JobSpec, models.OptimizerSpec, models.WorkerRange, models.FileData, models.TorchscriptSpec}


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _shape(schema: dict, seen=()) -> tuple:
    """(JSON types, schema names referenced) a property schema admits."""
    types, refs = set(), set()
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        refs.add(name)
        if name not in seen:
            t, r = _shape(COMPONENTS[name], seen + (name,))
            types |= t
            refs |= r
    t = schema.get("type")
    if isinstance(t, str):
        types.add(t)
    elif isinstance(t, list):
        types |= set(t)
    for key in ("oneOf", "anyOf", "allOf"):
        for sub in schema.get(key, []):
            t, r = _shape(sub, seen)
            types |= t
            refs |= r
    if "enum" in schema and not types:
        types |= {type(v).__name__.replace("str", "string") for v in schema["enum"]}
    if schema.get("oneOf") and not types:
        types.add("object")
    return types, refs


def _properties(schema: dict) -> tuple:
    """(properties, required) of an object schema, through ``allOf``."""
    props, required = dict(schema.get("properties", {})), set(schema.get("required", []))
    for sub in schema.get("allOf", []):
        if "$ref" in sub:
            sub = COMPONENTS[_ref_name(sub["$ref"])]
        p, r = _properties(sub)
        props.update(p)
        required |= r
    return props, required


_JSON_OF = {str: {"string"}, int: {"integer"}, float: {"number", "integer"}, bool: {"boolean"}}


def _compatible(py, schema: dict, nullable: bool = False) -> list:
    """Why the Python type ``py`` cannot hold values of ``schema`` (empty: it
    can); ``nullable``: ``py`` was declared ``Optional``."""
    types, refs = _shape(schema)
    origin, args = typing.get_origin(py), typing.get_args(py)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        assert len(inner) == 1, f"only Optional[X] unions are supported: {py!r}"
        return _compatible(inner[0], schema, nullable=True)
    problems = []
    if "null" in types and not nullable:
        problems.append("the document allows null but the SDK's type is not Optional")
    types.discard("null")
    if py is typing.Any:
        return problems
    if py in _JSON_OF:
        if not types & _JSON_OF[py]:
            problems.append(f"{py.__name__} declared, the document says {sorted(types)}")
        elif types - _JSON_OF[py] - ({"integer"} if py is float else set()):
            problems.append(f"{py.__name__} declared, the document also allows {sorted(types - _JSON_OF[py])}")
        return problems
    if origin in (list, typing.List):
        if types != {"array"}:
            return problems + [f"a list declared, the document says {sorted(types)}"]
        items = schema.get("items")
        if items is None and "$ref" in schema:
            items = COMPONENTS[_ref_name(schema["$ref"])].get("items")
        return problems + _compatible(args[0], items or {})
    if origin in (dict, typing.Dict) or py is dict:
        if "object" not in types:
            problems.append(f"a dict declared, the document says {sorted(types)}")
        return problems
    if py in models.SCHEMAS:
        want = models.SCHEMAS[py]
        if want not in refs:
            problems.append(f"{want} declared, the document refers to {sorted(refs) or sorted(types)}")
        return problems
    return problems + [f"no rule for {py!r}"]


@pytest.mark.parametrize("decl", list(models.SCHEMAS), ids=lambda d: d.__name__)
def test_each_declared_field_is_in_its_schema_with_a_compatible_type(decl):
    name = models.SCHEMAS[decl]
    assert name in COMPONENTS, f"the document has no schema {name} (the SDK declares {decl.__name__})"
    props, required = _properties(COMPONENTS[name])
    hints = typing.get_type_hints(decl)
    assert hints, f"{decl.__name__} declares no field"
    problems = []
    for field, py in hints.items():
        if field not in props:
            problems.append(f"{name}.{field}: not in the document (it has {sorted(props)})")
            continue
        problems += [f"{name}.{field}: {p}" for p in _compatible(py, props[field])]
        if field in decl.__required_keys__ and field not in required and decl not in REQUESTS:
            problems.append(f"{name}.{field}: the SDK counts on it but the document does not require it")
    if decl in REQUESTS:
        missing = required - set(hints) - {"kind"}
        if missing:
            problems.append(f"{name}: the SDK does not write the required {sorted(missing)}")
    assert not problems, "\n".join(problems)


def test_every_route_the_sdk_calls_is_in_the_document():
    missing = [f"{m} {p}" for m, p in models.OPERATIONS if m.lower() not in DOC["paths"].get(p, {})]
    assert not missing, f"the SDK calls routes the document lacks: {missing}"


def test_the_client_calls_only_the_declared_routes():
    """Every literal request in the client's source is in ``OPERATIONS``."""
    source = Path(trainyard.client.__file__).read_text()
    calls = re.findall(r'"(GET|POST|PUT|DELETE)",\s*f?"(/v1/[^"]*)"', source)
    assert len(calls) >= 15, f"found only {len(calls)} calls in the client: the pattern is stale"
    declared = set(models.OPERATIONS)
    undeclared = []
    for method, path in calls:
        template = re.sub(r"\{_quote\((\w+)\)\}", r"{\1}", path)
        if (method, template) not in declared:
            undeclared.append(f"{method} {template}")
    assert not undeclared, f"the client calls routes trainyard.models.OPERATIONS does not list: {undeclared}"


def test_the_model_and_dataset_kinds_fit_writes_exist():
    """``fit`` writes ``{"kind": "torchscript", "url"}`` and ``{"kind": "file", "url"}``."""
    for schema, kind, fields in (("ModelSpec", "torchscript", {"url"}), ("DatasetSpec", "file", {"url", "format"})):
        variants = {tuple(v["properties"]["kind"]["enum"]): v for v in COMPONENTS[schema]["oneOf"]}
        assert (kind,) in variants, f"{schema} has no {kind!r} variant: {sorted(variants)}"
        assert fields <= set(variants[(kind,)]["properties"]), variants[(kind,)]
    spec_props, _ = _properties(COMPONENTS["JobSpec"])
    assert {"loss", "strategy", "workers", "eval_fraction", "seed", "batch_size", "epochs", "steps"} <= set(spec_props)
    assert "cross_entropy" in COMPONENTS["Loss"]["enum"]


def test_the_model_route_takes_both_formats():
    params = {p["name"]: p for p in DOC["paths"]["/v1/jobs/{id}/model"]["get"]["parameters"]}
    assert set(params["format"]["schema"]["enum"]) == {"safetensors", "torchscript"}
    listing = {p["name"] for p in DOC["paths"]["/v1/jobs"]["get"]["parameters"]}
    assert {"limit", "cursor", "state", "owner"} <= listing
    for path in ("/v1/jobs/{id}/events", "/v1/jobs/{id}/logs"):
        assert {"after", "limit"} <= {p["name"] for p in DOC["paths"][path]["get"]["parameters"]}
