"""JSON request bodies read strictly: UTF-8 only, and a key given twice in an object is refused.

FastAPI decodes a body with `json.loads`, where the last of two equal keys wins (`{"max_trials": 3,
"max_trials": 4}` set 4) and bytes in another encoding are guessed at (a UTF-16 byte-order mark is
read as UTF-16). A proxy or a log may read the other copy, so both are refused, as the spec's YAML
loader refuses a duplicate key. Routers whose operations take a JSON body use `StrictJsonRoute`;
the app's error handlers say the reason (`optico.service.app._body_problem`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from optico.input_files import unique_keys


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            # UnicodeDecodeError and DuplicateKeyError reach FastAPI's 400, said as a 422 with the reason.
            text = (await self.body()).decode("utf-8-sig")  # a UTF-8 byte-order mark is fine
            self._json = json.loads(text, object_pairs_hook=unique_keys)
        return self._json


class StrictJsonRoute(APIRoute):
    """An API route whose JSON body is read by `StrictJsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict
