"""Schemathesis hooks for test_openapi_fuzz.py, loaded by `schemathesis run`
through SCHEMATHESIS_HOOKS (not a test module).

HERALD_FUZZ_LOG names a file that gets one JSON line per request sent
(`{"operation": "GET /v1/me/sync", "status": 200, "phase": "fuzzing"}`), so
the test can check that generated requests reached real handlers and not
only refusals.
"""

from __future__ import annotations

import json
import os

import schemathesis

# A held long-poll (`GET /v1/me/sync` with `wait` > 0 and nothing after the
# cursor) is answered empty only when `wait` runs out: up to 60 s a request.
# Valid waits above this are sent as this, so holding is still exercised but
# costs at most a second; out-of-range and malformed values go out unchanged.
MAX_WAIT = 1


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.operation.path == "/v1/me/sync" and case.query:
        wait = case.query.get("wait")
        if isinstance(wait, str) and wait.isascii() and wait.isdigit():
            wait = int(wait)  # the coverage phase sends query values as text
        if type(wait) is int and MAX_WAIT < wait <= 60:
            case.query["wait"] = MAX_WAIT


@schemathesis.hook
def after_call(context, case, response):
    with open(os.environ["HERALD_FUZZ_LOG"], "a") as f:
        f.write(json.dumps({"operation": case.operation.label, "status": response.status_code,
                            "phase": case.meta.phase.name.value if case.meta else None}) + "\n")
