"""`optico llm ...`: the endpoint the LLM reasoners use. Registered in optico.cli.

Kept light: the openai package is imported only when a command runs.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from optico.terminal import console

llm_app = typer.Typer(no_args_is_help=True, help="The LLM endpoint of the LLM reasoners (OPTICO_LLM_*).")

_CHECK_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok"],
                 "properties": {"ok": {"type": "boolean"}}}
_CHECK_MESSAGES = [
    {"role": "system", "content": "You check that an endpoint works. Answer with one JSON object."},
    {"role": "user", "content": 'Reply with the JSON object {"ok": true} and nothing else.'},
]


def endpoint_report(client: Any) -> dict[str, Any]:
    """One small structured request (plus GET /models); what worked, how fast. Raises EndpointError."""
    from optico.llm.client import EndpointError
    from optico.llm.parsing import extract_json, split_reasoning

    forced = client.settings.structured_output != "auto"
    c = client.complete(_CHECK_MESSAGES, schema=_CHECK_SCHEMA, name="optico_check",
                        max_tokens=min(client.settings.max_tokens, 512))
    answer = extract_json(split_reasoning(c.text)[1])
    try:
        served = client.list_models()
        listed: bool | None = client.model in served
    except EndpointError:
        listed = None  # Azure deployments and some proxies do not list models
    return {
        "endpoint": client.endpoint, "model": client.model, "model_reported": c.model, "latency_s": c.latency_s,
        "attempts": c.attempts, "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
        "tokens_reported": c.tokens_reported, "usage_source": c.usage_source, "streamed": c.streamed,
        "cost_usd": c.cost_usd, "structured_output": c.mode,
        "json_schema": None if forced and c.mode != "json_schema" else c.mode == "json_schema",
        "answer_ok": answer == {"ok": True}, "model_listed": listed, "notes": c.notes,
    }


@llm_app.command("check")
def check(as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
    """Send one small request to the configured endpoint: report the model, the latency and
    whether JSON-schema structured output is supported. Exit 1 if the endpoint fails, 2 if
    the settings are incomplete."""
    from optico.llm.client import ChatClient, EndpointError
    from optico.llm.settings import load_settings
    from optico.redact import redact
    from optico.terminal import fail
    from optico.textsafe import markup

    try:
        client = ChatClient(load_settings())
    except ValueError as exc:
        fail(str(exc))
    try:
        report = endpoint_report(client)
    except EndpointError as exc:
        if as_json:  # a script gets an object to read either way
            print(redact(json.dumps({"endpoint": client.endpoint, "model": client.model, "error": str(exc)},
                                    indent=2)))
        # The endpoint's error text, the model name and the answer are someone else's: `fail` and
        # `markup` show them literally (a "[/x]" is not Rich markup, an ESC does not reach the terminal).
        fail(f"{client.endpoint} ({client.model}): {exc}", code=1)
    finally:
        client.close()
    if as_json:
        print(redact(json.dumps(report, indent=2)))
        return
    schema = {True: "supported", False: f"not supported (answers requested as {report['structured_output']})",
              None: f"not tested (OPTICO_LLM_STRUCTURED_OUTPUT={report['structured_output']})"}[report["json_schema"]]
    tokens = f"{report['prompt_tokens']}+{report['completion_tokens']}"
    if not report["tokens_reported"]:
        tokens += " (estimated: the endpoint reported no usage)"
    elif report["usage_source"] == "probe":
        tokens += " (no usage in streams: prompt counted by a 1-token request)"
    listed = {True: "listed by /models", False: "NOT listed by /models", None: "/models unavailable"}
    lines = [
        f"endpoint     {report['endpoint']}",
        f"model        {report['model']} (answered as {report['model_reported']}; {listed[report['model_listed']]})",
        f"latency      {report['latency_s']:.2f} s, {report['attempts']} attempt(s)",
        f"tokens       {tokens}" + (f", ${report['cost_usd']:.6f}" if report["cost_usd"] is not None else ""),
        f"JSON schema  {schema}",
        f"answer       {'valid JSON' if report['answer_ok'] else 'not the JSON asked for'}",
    ]
    for note in report["notes"]:
        lines.append(f"note         {note}")
    console.print("\n".join(markup(redact(line), one_line=True) for line in lines), highlight=False, soft_wrap=True)
