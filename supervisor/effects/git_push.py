"""The built-in `git.push` effect kind: move a branch of the task's repository to its verified
candidate, from the supervisor's own mirror, as a compare-and-swap (docs/design.md, Effects).

The rendered request is `{"url", "branch", "expected", "candidate", "credential"}`. Each attempt
first reads the branch (`git ls-remote`):

    at `candidate`                     Delivered(replayed=True): an earlier attempt (or someone)
                                       already moved it there; nothing is pushed
    at neither (or absent)             Undeliverable `branch_moved`: never an overwrite
    at `expected`, candidate not a     Undeliverable `not_fast_forward`
      descendant of it
    at `expected`                      `git push --force-with-lease=refs/heads/<branch>:<expected>
                                       <candidate>:refs/heads/<branch>`; a lease the remote
                                       finds stale is `branch_moved` (or replayed, if the branch
                                       is at the candidate by then)

A mirror that lacks the candidate (another supervisor on the same PostgreSQL ledger verified the
task and imported it into its own mirror) gets it from the reporting step's bundle in the shared
artifact store (`SharedCandidates`) before the push is refused `unknown_candidate`.

A remote that cannot be reached is Unanswered (retried until the deadline); a refusal by the
remote for another reason (a hook, a protected branch) is Undeliverable `push_rejected`. A remote
reached over the network is first resolved once and checked against the supervisor's
`effect_allowed_hosts` (Undeliverable `destination_refused`, nothing run), and git is held to the
address checked (supervisor/effects/addresses.py).

A credential for the push reaches git only through its environment, from a private folder
removed after the attempt: a value holding `PRIVATE KEY` is an SSH key (written 0600,
named by `GIT_SSH_COMMAND ... -i <file> -o IdentitiesOnly=yes`), anything else is an HTTPS
token given as the password by a `GIT_ASKPASS` script that reads it from the environment, with
configured credential helpers switched off so that none stores it. The username asked for is
the one in the URL if any (git then does not ask), else `x-access-token`.

That folder is made under the supervisor's own 0700 scratch folder beside the mirrors
(`<mirrors>.push`, never the shared temporary folder), and locked (`flock`) while in use. A
supervisor killed mid-push (SIGKILL runs no cleanup) leaves one behind, its lock released by
the kernel; the next start removes every folder there that no process holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tether.supervisor import durable
from tether.supervisor.effects.addresses import (
    DestinationRefused,
    GitPin,
    NotResolved,
    Resolver,
    checked_address,
    git_pin,
    pinned_environment,
    system_resolver,
)
from tether.supervisor.effects.credentials import CredentialMissing, Credentials
from tether.supervisor.ledger.destinations import PUBLIC_HOSTS, Destinations, remote_destination
from tether.supervisor.ledger.outbox import Answer, Delivered, Outgoing, Unanswered, Undeliverable
from tether.supervisor.repos.candidates import SharedCandidates
from tether.supervisor.repos.mirror import BundleRefused, MirrorError, Mirrors, PushRejected

DEFAULT_USERNAME: Final = "x-access-token"
TOKEN_VARIABLE: Final = "TETHER_PUSH_TOKEN"  # noqa: S105 - the variable's name, not a value
USERNAME_VARIABLE: Final = "TETHER_PUSH_USERNAME"
_ASKPASS: Final = f"""#!/bin/sh
case "$1" in
  Username*) printf '%s\\n' "${USERNAME_VARIABLE}" ;;
  *) printf '%s\\n' "${TOKEN_VARIABLE}" ;;
esac
"""


class GitPushDeliverer:
    """Delivers `git.push` effects from the mirrors under one folder; `candidates`, when given,
    brings in a candidate the mirror lacks. A remote reached over the network goes only to
    an address `destinations` allows, resolved once by `resolver` (supervisor/effects/
    addresses.py, `git_pin`)."""

    kind = "git.push"

    def __init__(
        self,
        mirrors: Mirrors,
        candidates: SharedCandidates | None = None,
        *,
        destinations: Destinations | None = None,
        resolver: Resolver = system_resolver,
    ) -> None:
        self.mirrors = mirrors
        self.candidates = candidates
        self.destinations = destinations or PUBLIC_HOSTS
        self.resolver = resolver
        self.scratch = scratch_folder(mirrors)
        remove_leftovers(self.scratch)

    async def _pin(self, out: Outgoing, url: str) -> GitPin | Answer:
        """What holds git to the remote's checked address (nothing for a path), or the
        answer that ends the attempt before git runs."""
        try:
            remote = remote_destination(url)
        except ValueError as exc:
            return Undeliverable(status=None, detail=str(exc), code="destination_refused")
        if remote is None:
            return GitPin()
        scheme, host, port = remote
        try:
            address = await checked_address(
                self.destinations, out.tenant, host, port, self.resolver
            )
        except DestinationRefused as exc:
            return Undeliverable(status=None, detail=str(exc), code="destination_refused")
        except NotResolved as exc:
            return Unanswered(detail=f"not connected: {exc}", sent=False)
        return git_pin(scheme, host, port, address)

    async def deliver(self, out: Outgoing, secrets: Credentials) -> Answer:
        request = out.request
        url, branch = str(request["url"]), str(request["branch"])
        expected, candidate = str(request["expected"]), str(request["candidate"])
        credential = request.get("credential")
        try:
            value = None if credential is None else secrets.read(str(credential))
        except CredentialMissing as exc:
            return Undeliverable(status=None, detail=str(exc), code="credential_missing")
        pin = await self._pin(out, url)
        if not isinstance(pin, GitPin):
            return pin
        with credential_environment(value, self.scratch) as credential_env:
            env = pinned_environment(credential_env, pin)
            try:
                at = await self.mirrors.branch_head(url, branch, env=env)
            except MirrorError as exc:
                return Unanswered(detail=str(exc), sent=False)
            if at == candidate:
                return _replayed(branch, candidate)
            if at != expected:
                where = "does not exist" if at is None else f"is at {at}"
                return Undeliverable(
                    status=None,
                    detail=f"branch {branch} {where}, not at the approved base {expected}",
                    code="branch_moved",
                )
            descends = await self.mirrors.is_ancestor(url, expected, candidate)
            why = ""
            if descends is None and self.candidates is not None:
                try:
                    missing = await self.candidates.bring(self.mirrors, url, out.task_id, candidate)
                except BundleRefused as exc:
                    missing = str(exc)
                except MirrorError as exc:  # the remote cannot be read for the bundle's base
                    return Unanswered(detail=str(exc), sent=False)
                if missing is None:
                    descends = await self.mirrors.is_ancestor(url, expected, candidate)
                why = "" if missing is None else f" ({missing})"
            if descends is None:
                return Undeliverable(
                    status=None,
                    detail=(
                        f"the mirror lacks the candidate {candidate} or the base {expected}{why}"
                    ),
                    code="unknown_candidate",
                )
            if not descends:
                return Undeliverable(
                    status=None,
                    detail=f"candidate {candidate} does not descend from {branch} at {expected}",
                    code="not_fast_forward",
                )
            try:
                await self.mirrors.push(url, candidate, branch, expected, env=env)
            except PushRejected as exc:
                return await self._rejected(exc, url, branch, candidate, env)
            except MirrorError as exc:
                return Unanswered(detail=str(exc), sent=True)
        return Delivered(status=None, detail=f"branch {branch} moved {expected} -> {candidate}")

    async def _rejected(
        self, exc: PushRejected, url: str, branch: str, candidate: str, env: dict[str, str]
    ) -> Answer:
        if exc.reason == "non-fast-forward":
            return Undeliverable(status=None, detail=str(exc), code="not_fast_forward")
        if exc.reason != "stale":
            return Undeliverable(status=None, detail=str(exc), code="push_rejected")
        try:  # the branch moved between the read and the push: to the candidate, or away
            at = await self.mirrors.branch_head(url, branch, env=env)
        except MirrorError as again:
            return Unanswered(detail=str(again), sent=True)
        if at == candidate:
            return _replayed(branch, candidate)
        return Undeliverable(status=None, detail=str(exc), code="branch_moved")


def _replayed(branch: str, candidate: str) -> Delivered:
    return Delivered(status=None, detail=f"branch {branch} already at {candidate}", replayed=True)


PREFIX: Final = "tether-push-"
LOCK: Final = ".lock"


def scratch_folder(mirrors: Mirrors) -> Path:
    """The supervisor's private folder for credentials handed to git, beside the mirrors;
    made 0700 if missing (and made 0700 again if it was not). The folder is synced into its
    parent; the files in it never are: a credential is scratch, removed after the attempt,
    and one a power cut leaves behind is removed at the next start (`remove_leftovers`)."""
    folder = mirrors.root.parent / f"{mirrors.root.name}.push"
    durable.made_folder(folder, mode=0o700)
    folder.chmod(0o700)
    return folder


def remove_leftovers(scratch: Path) -> None:
    """Remove the credential folders under `scratch` that no process holds (a supervisor
    killed mid-push); one in use (its lock held, by this process or another) is left."""
    for folder in scratch.glob(f"{PREFIX}*"):
        try:
            fd = os.open(folder / LOCK, os.O_RDWR)
        except FileNotFoundError:
            shutil.rmtree(folder, ignore_errors=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        else:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def credential_environment(value: str | None, scratch: Path) -> Iterator[dict[str, str]]:
    """The variables that hand git the credential `value` (none for None), valid inside the
    block; the private folder under `scratch` they point into is removed on leaving it."""
    if value is None:
        yield {}
        return
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=scratch))  # 0700, this user only
    lock = os.open(folder / LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # in use: `remove_leftovers` leaves it
    try:
        if "PRIVATE KEY" in value:
            key = folder / "key"
            key.touch(mode=0o600)
            key.write_text(value if value.endswith("\n") else value + "\n", encoding="utf-8")
            ssh = os.environ.get("GIT_SSH_COMMAND") or "ssh -o BatchMode=yes"
            yield {"GIT_SSH_COMMAND": f"{ssh} -i {shlex.quote(str(key))} -o IdentitiesOnly=yes"}
        else:
            askpass = folder / "askpass"
            askpass.touch(mode=0o700)
            askpass.write_text(_ASKPASS, encoding="utf-8")
            yield {
                "GIT_ASKPASS": str(askpass),
                TOKEN_VARIABLE: value,
                USERNAME_VARIABLE: DEFAULT_USERNAME,
                # No configured credential helper sees the token (`store` would save it).
                "GIT_CONFIG_COUNT": "1",
                "GIT_CONFIG_KEY_0": "credential.helper",
                "GIT_CONFIG_VALUE_0": "",
            }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)
