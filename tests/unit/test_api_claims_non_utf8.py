"""Claims API: a body that is not UTF-8 is a 400 whose detail says why and where.

Promise (docs/gateway-protocol.md, section 8, "Effect claims", "Bad input on both"):
    "400 {"error": "INVALID_REQUEST"} for a body that is not JSON (also one that is not
    UTF-8; `detail` says why and where; ...)"
A JSON-shaped body with an invalid UTF-8 byte inside a string is answered 400 with
"body is not UTF-8: ... at byte N" on both claim endpoints, mounted alone or in the app
(found by an outside review: FastAPI's generic "There was an error parsing the body").
"""

from __future__ import annotations

import re

import pytest

from tests.unit.test_claims_api import api_client, client

BODY = b'{"tenant_id": "\xff"}'  # the invalid byte is at offset 15


@pytest.mark.parametrize("served", ["router", "api"])
@pytest.mark.parametrize("path", ["/v1/effects/claims",
                                  f"/v1/effects/claims/eff_{'0' * 32}/complete"])
def test_a_non_utf8_body_400_says_why_and_where(served, path):
    http = client() if served == "router" else api_client()
    answer = http.post(path, content=BODY, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    body = answer.json()
    assert body["error"] == "INVALID_REQUEST"
    detail = body["detail"]
    # why: it names the encoding problem
    assert "UTF-8" in detail or "utf-8" in detail, detail
    # where: it names a position in the body
    assert re.search(r"\d", detail), detail
