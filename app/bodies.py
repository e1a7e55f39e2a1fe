"""Callback request bodies checked before Dash reads them: a malformed one (not JSON, not
an object, an unknown output, inputs of the wrong shape or count) is a 400 with one line,
not a 500 from deep inside Dash's dispatch.

The shape is what the Dash renderer sends to `/_dash-update-component`:
`{"output": str, "outputs": item | [item], "inputs": [item], "state": [item],
"changedPropIds": [str]}`, where an item is `{"id": str | object, "property": str, ...}`
or, for a pattern-matching (ALL) dependency, a list of such items."""

from __future__ import annotations

import functools
import json
from typing import Any, cast

import dash
import flask

ROUTE = "_dash-update-component"


JSON_TYPES = {"dict": "object", "list": "array", "str": "string", "int": "number",
              "float": "number", "bool": "boolean", "NoneType": "null"}


def _kind(value: Any) -> str:
    return JSON_TYPES.get(type(value).__name__, type(value).__name__)


def _text(body: str, status: int = 400) -> flask.Response:
    return flask.Response("popviz: " + body + "\n", status, mimetype="text/plain")


def _item_problem(item: Any, where: str) -> str | None:
    if isinstance(item, list):  # a pattern-matching dependency: one item per match
        for n, one in enumerate(item):
            if isinstance(one, list):
                return f"{where}: lists nested in lists"
            if (problem := _item_problem(one, f"{where}[{n}]")) is not None:
                return problem
        return None
    if not isinstance(item, dict):
        return f"{where}: {_kind(item)}, not an object"
    if not isinstance(item.get("id"), str | dict) or not isinstance(item.get("property"),
                                                                     str):
        return f"{where}: needs an 'id' and a 'property'"
    return None


def body_problem(body: Any, callbacks: dict[str, Any]) -> str | None:
    """Why `body` is not a callback request for one of `callbacks` (None: it is)."""
    if not isinstance(body, dict):
        return f"a callback body is a JSON object, not {_kind(body)}"
    output = body.get("output")
    if not isinstance(output, str):
        return "a callback body names its 'output' (a string)"
    spec = callbacks.get(output)
    if spec is None:
        return f"no callback outputs {output[:100]!r}"
    outputs = body.get("outputs")
    count = len(output.strip(".").split("...")) if output.startswith("..") else 0
    if count and not (isinstance(outputs, list) and len(outputs) == count):
        return f"'outputs' must be a list of {count} (this callback's outputs)"
    if not count and not isinstance(outputs, dict | list):  # a list: an ALL pattern
        return "'outputs' must be an object (this callback's output)"
    if spec.get("no_output"):
        outputs = []
    for n, item in enumerate(cast(list[Any], outputs) if count else [outputs]):  # checked
        if (problem := _item_problem(item, f"outputs[{n}]")) is not None:
            return problem
    for key, required in (("inputs", True), ("state", False)):
        items = body.get(key, None if required else [])
        expected = len(spec.get(key) or [])
        if not isinstance(items, list) or len(items) != expected:
            return f"'{key}' must be a list of {expected} (this callback's {key})"
        for n, item in enumerate(items):
            if (problem := _item_problem(item, f"{key}[{n}]")) is not None:
                return problem
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        return "'changedPropIds' must be a list of strings"
    return None


def install(app: dash.Dash) -> None:
    """Check every callback body before Dash's handler reads it (and after the Host and
    token checks, which are `before_request` hooks)."""
    path = app.config.routes_pathname_prefix + ROUTE
    endpoint = next(r.endpoint for r in app.server.url_map.iter_rules() if r.rule == path)
    dispatch = app.server.view_functions[endpoint]

    @functools.wraps(dispatch)
    def checked(*args: Any, **kwargs: Any) -> Any:
        request = flask.request
        if not request.is_json:
            return _text("a callback body is JSON (Content-Type: application/json)")
        try:
            body = json.loads(request.get_data(cache=True))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return _text(f"a callback body that is not JSON ({type(exc).__name__})")
        problem = body_problem(body, app.callback_map)
        return dispatch(*args, **kwargs) if problem is None else _text(problem)

    app.server.view_functions[endpoint] = checked
