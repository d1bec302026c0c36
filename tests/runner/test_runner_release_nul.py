"""A tool's or a model's error text may hold NUL, which the supervisor refuses in a release's
detail (tests/wire/test_wire_nul.py): the runner sends it as U+FFFD, so its release is accepted."""

from __future__ import annotations

import json
from pathlib import Path

from tests.runner.test_runner_fakes import make_lease, make_rig
from tests.runner.test_runner_steps import run_until, step_outcomes
from tether.runner.kinds.base import StepContext, StepOutput
from tether.runner.kinds.registry import KindRegistry
from tether.wire.codec import decode
from tether.wire.records import ReleaseRequest


async def test_a_failure_detail_with_nul_is_released_without_it(tmp_path: Path) -> None:
    async def broken(_ctx: StepContext) -> StepOutput:
        raise RuntimeError("the tool wrote \x00\x00 and stopped")

    kinds = KindRegistry.default(entry_points=False)
    kinds.register("broken", broken)
    rig = make_rig(tmp_path, kinds=kinds)
    rig.supervisor.requeue_released = False
    rig.supervisor.offer(make_lease("s1", kind="broken"))
    await run_until(rig, lambda: step_outcomes(rig) == ["released: transient"])
    [release] = rig.supervisor.of("release", "s1")
    assert "the tool wrote \ufffd\ufffd and stopped" in release.body["detail"]
    sent = decode(json.dumps(release.body).encode(), ReleaseRequest)  # as the supervisor reads it
    assert "\x00" not in sent.detail
