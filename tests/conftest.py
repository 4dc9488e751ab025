"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# the plugin kit's contract checks assert: their failures explain themselves
pytest.register_assert_rewrite("vkshmem.testing")


@pytest.fixture(autouse=True)
def no_new_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    """A GPU test (one using a validated ``dev`` fixture, tests/gpu/helpers.py) fails when the
    Khronos validation layer reported an error while it ran."""
    if "dev" not in request.fixturenames:
        yield
        return
    d = request.getfixturevalue("dev")
    before = len(d.validation_errors)
    yield
    assert d.validation_errors[before:] == [], "\n".join(d.validation_errors[before:])
