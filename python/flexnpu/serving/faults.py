"""Fault injection over HTTP, for soak tests (bench/soak.py): routes that exist only when the
server was started with FLEXNPU_FAULT_INJECTION=1, so a production server never has them.

    GET  /debug/faults          {"faults": [kinds the engine can inject]}
    POST /debug/faults/{kind}   JSON object of arguments -> {"injected": kind, "result": ...}

What a fault does is the engine's: `engine.inject_fault(kind, args) -> JSON-able` and
`engine.fault_kinds() -> list[str]` (e.g. "instance-failure": an engine instance's thread
fails, and the isolation restarts it while the others serve). An engine without them answers
501, and the soak reports the fault as skipped.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from flexnpu.serving.openai_protocol import APIError

FAULT_INJECTION_ENV = "FLEXNPU_FAULT_INJECTION"


def enabled(environ: dict[str, str] | None = None) -> bool:
    value = (environ if environ is not None else os.environ).get(FAULT_INJECTION_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def fault_kinds(engine: Any) -> list[str]:
    kinds = getattr(engine, "fault_kinds", None)
    return list(kinds()) if callable(kinds) else []


def add_routes(app: FastAPI, engine: Any) -> None:
    """Adds the /debug/faults routes when FLEXNPU_FAULT_INJECTION is on; else nothing."""
    if not enabled():
        return

    @app.get("/debug/faults")
    async def list_faults() -> JSONResponse:
        return JSONResponse({"faults": fault_kinds(engine)})

    @app.post("/debug/faults/{kind}")
    async def inject(kind: str, request: Request) -> JSONResponse:
        hook = getattr(engine, "inject_fault", None)
        if not callable(hook):
            raise APIError("this engine has no fault hook (Engine.inject_fault)", 501, "kind")
        if kind not in fault_kinds(engine):
            raise APIError(f"unknown fault {kind!r}; known: {fault_kinds(engine)}", 404, "kind")
        raw = await request.body()
        try:
            args = json.loads(raw) if raw.strip() else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(f"fault arguments are not valid JSON: {e}") from None
        if not isinstance(args, dict):
            raise APIError("fault arguments must be a JSON object")
        try:
            result = hook(kind, args)
        except ValueError as e:
            raise APIError(str(e)) from None
        return JSONResponse({"injected": kind, "result": result})
