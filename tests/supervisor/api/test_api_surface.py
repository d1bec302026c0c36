"""The HTTP package's public surface is deliberate: the app factory and the drain hook."""

from __future__ import annotations

import tether.supervisor.api as api_pkg


def test_the_api_package_exports_exactly_its_surface() -> None:
    assert sorted(api_pkg.__all__) == ["create_app", "drain"]
    assert all(callable(getattr(api_pkg, name)) for name in api_pkg.__all__)
