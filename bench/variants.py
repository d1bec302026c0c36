"""The supervisor's code with one round-3 check taken out, for `bench.features` (issue 28):
what a check without a switch costs is read against the same code without it, in one run.
Only the benchmark runs these; the supervisor has no switch of its own.

- `no-token-binding`: a lease is taken from any runner token of its pool that names its fence.
  `held_step`, which every rule about a lease asks first, is replaced in each ledger module
  that calls it by the schedule explorer's `lease-takeover` plant (`tether.sim.plants`): the
  same read without the comparison of the attempt's token with the caller's.
- `no-render-checks`: an `http` effect's URL and header values are filled as plain text, as
  before issue 23 (`templates.render_url` and `render_headers` replaced by
  `templates.render(..., as_text=True)`): no percent-encoding by position, no check of the
  scheme, host, port and literal prefix, no refusal of control characters. The seal that
  refuses a `{{` an output built stays: it came before issue 23 (credentials are filled into
  that text at send time) and is no part of the checks measured.

`python -m bench.variants NAME ARGS...` is `tether-supervisor ARGS...` with the variant in place.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from tether.sim.plants import PLANTS
from tether.supervisor.ledger import steps
from tether.wire import templates

NAMES = ("no-token-binding", "no-render-checks")


def _unchecked_url(template: str, outputs: Mapping[str, Any], where: str = "payload.url") -> str:
    return str(templates.render(template, outputs, where, as_text=True))


def _unchecked_headers(
    headers: Mapping[str, Any], outputs: Mapping[str, Any], where: str = "payload.headers"
) -> dict[str, str]:
    rendered: dict[str, str] = templates.render(headers, outputs, where, as_text=True)
    return rendered


def _swaps(name: str) -> list[tuple[Any, str, Any]]:
    """(module, attribute, replacement) for the variant `name`."""
    if name == "no-token-binding":
        original = steps.held_step
        plant = PLANTS["lease-takeover"].replacement
        callers = [
            m
            for n, m in list(sys.modules.items())
            if n.startswith("tether.supervisor.") and getattr(m, "held_step", None) is original
        ]
        return [(m, "held_step", plant) for m in callers]
    if name == "no-render-checks":
        return [
            (templates, "render_url", _unchecked_url),
            (templates, "render_headers", _unchecked_headers),
        ]
    raise ValueError(f"unknown variant {name!r}; known: {', '.join(NAMES)}")


@contextlib.contextmanager
def without(name: str) -> Iterator[int]:
    """The variant `name` in place until the block ends; yields how many names were swapped."""
    import tether.supervisor.service  # noqa: F401  (every ledger module that may call a seam)

    swaps = _swaps(name)
    if not swaps:
        raise RuntimeError(f"variant {name!r} found nothing to swap")
    saved = [(m, attr, getattr(m, attr)) for m, attr, _ in swaps]
    for m, attr, replacement in swaps:
        setattr(m, attr, replacement)
    try:
        yield len(swaps)
    finally:
        for m, attr, value in saved:
            setattr(m, attr, value)


def main(argv: list[str]) -> int:
    from tether.supervisor.cli import main as supervisor_main

    if not argv or argv[0] not in NAMES:
        print(f"usage: python -m bench.variants {{{','.join(NAMES)}}} ARGS...", file=sys.stderr)
        return 2
    with without(argv[0]):
        return supervisor_main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
