"""Schemathesis explores every documented operation of the API (small budget) and finds no server error.

Its strategies are driven with Hypothesis directly: ``schemathesis.pytest.from_fixture`` does not work
with the installed pytest (``'Function' object has no attribute '_nodeid'``).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.integration import edge_fixtures
from tests.integration.edge_fixtures import Edge

pytestmark = pytest.mark.integration
edge, moto_endpoint = edge_fixtures.edge, edge_fixtures.moto_endpoint
MAX_EXAMPLES = 15


def test_no_server_errors(edge: Edge) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", edge.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    errors: list[tuple] = []
    seen: set[tuple[str, str, int]] = set()
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def explore(case) -> None:
            if case.headers:
                case.headers.pop("Authorization", None)
            response = case.call(headers={"X-API-Key": edge.key})
            seen.add((case.method, case.path, response.status_code))
            if response.status_code >= 500:
                errors.append((case.method, case.path, case.path_parameters, response.status_code, response.text[:300]))

        explore()
    assert errors == []
    assert ("POST", "/v1/jobs", 202) in seen and ("GET", "/v1/jobs", 200) in seen, sorted(seen)
