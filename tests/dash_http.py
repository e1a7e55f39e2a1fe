"""The POST bodies a browser sends to `/_dash-update-component`, built from the app's own
`/_dash-dependencies` (so the output keys, allow_duplicate hashes included, are real).
Used by the HTTP tests and by bench/bench_serve.py."""

from __future__ import annotations

from typing import Any


def _parse_output(output: str) -> list[dict[str, str]]:
    names = output.strip(".").split("...") if output.startswith("..") else [output]
    outs = []
    for name in names:
        id_, _, prop = name.partition(".")
        outs.append({"id": id_, "property": prop.split("@")[0]})  # as the renderer sends
    return outs


def find(deps: list[dict[str, Any]], output: str, trigger: str | None = None) -> dict[str, Any]:
    """The one dependency with `output` ('id.property') among its outputs (and, when
    several write it, `trigger` ('id.property') among its inputs)."""
    hits = [d for d in deps
            if output in (f"{o['id']}.{o['property']}" for o in _parse_output(d["output"]))
            and (trigger is None or trigger in (f"{i['id']}.{i['property']}"
                                                for i in d["inputs"]))]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} callbacks output {output!r}")
    return hits[0]


def payload(dep: dict[str, Any], values: dict[str, Any],
            changed: list[str] | None = None) -> dict[str, Any]:
    """The request body for callback `dep` with `values` ('id.property' -> value) for its
    inputs and state; `changed` are the inputs that fired (default: the first)."""
    def item(spec: dict[str, Any]) -> dict[str, Any]:
        key = f"{spec['id']}.{spec['property']}"
        return {"id": spec["id"], "property": spec["property"], "value": values.get(key)}

    inputs = [item(i) for i in dep["inputs"]]
    outputs = _parse_output(dep["output"])
    return {
        "output": dep["output"],
        "outputs": outputs if dep["output"].startswith("..") else outputs[0],
        "inputs": inputs,
        "state": [item(s) for s in dep["state"]],
        "changedPropIds": changed or [f"{inputs[0]['id']}.{inputs[0]['property']}"],
    }
