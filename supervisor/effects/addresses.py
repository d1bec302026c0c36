"""Resolve once, check, connect to that address: how a delivery reaches only a destination the
supervisor allows (docs/design.md, Effects: Destinations).

Before an attempt sends anything, its host is judged by the text the plan wrote
(`Destinations.refuse_host`), then resolved **once** (`Resolver`; the system's by default) and
every address of the answer judged (`Destinations.refuse_address`); the attempt then connects
to the first address and to nothing else, so a DNS answer that changes between the check and
the connection cannot move it:

- `http`: the request goes to the URL with that address in place of the name, with the
  name kept as its `Host` header and, for https, as the TLS server name (httpx's
  `sni_hostname` request extension), so the certificate is still verified for the name;
- `git.push`: git is held to the address by its own settings, given through its environment
  (`git_pin`): for http(s), `http.curloptResolve` (curl uses that address for the name), no
  redirects followed and no proxy; for ssh, `-o HostName=<address>` with
  `-o HostKeyAlias=<name>` (the host key is still checked for the name).

What remains (docs/design.md, Effects: Destinations): a `git://` remote cannot be held this
way (git resolves the name again itself); ssh settings of the supervisor's own user (a
`ProxyCommand` or `ProxyJump` in its ssh config) still apply; and the supervisor's reads of a
repository (the head at approval, a fetch) are not effects and are not held.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import shlex
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import anyio

from tether.supervisor.ledger.destinations import Address, Destinations, Host, plain_address

# How long one resolution may take: the same bound as http's connect timeout.
RESOLVE_TIMEOUT_S: Final = 10.0

Resolver = Callable[[str, int], Awaitable[list[Address]]]


async def system_resolver(name: str, port: int) -> list[Address]:
    """The addresses the system's resolver answers for `name`, in its order, once each."""
    found: list[Address] = []
    for *_, sockaddr in await anyio.getaddrinfo(name, port, type=socket.SOCK_STREAM):
        address = plain_address(ipaddress.ip_address(str(sockaddr[0]).partition("%")[0]))
        if address not in found:
            found.append(address)
    return found


class DestinationRefused(Exception):
    """The destination, or an address its name resolved to, is not allowed; nothing is sent.
    The message says which rule refused it."""


class NotResolved(Exception):
    """The name could not be resolved (or not in time); nothing is sent."""


async def checked_address(
    rule: Destinations,
    tenant: str,
    host: Host,
    port: int,
    resolver: Resolver,
    *,
    timeout_s: float = RESOLVE_TIMEOUT_S,
) -> Address:
    """The one address `tenant`'s delivery to `host`:`port` connects to: `host` itself if it
    is an address, else the first of its name's addresses, resolved once. Every address of
    the answer must be allowed, not only the first: an answer mixing a public address with
    an internal one is refused whole (`DestinationRefused`), so the order of a DNS answer
    cannot choose between them."""
    problem = rule.refuse_host(tenant, host, port)
    if problem is not None:
        raise DestinationRefused(problem)
    if host.address is not None:
        return host.address
    name = str(host.name)
    try:
        with anyio.fail_after(timeout_s):
            addresses = await resolver(name, port)
    except TimeoutError:
        raise NotResolved(f"{name} was not resolved within {timeout_s:g} s") from None
    except OSError as exc:
        raise NotResolved(f"{name} cannot be resolved: {exc.strerror or exc}") from None
    if not addresses:
        raise NotResolved(f"{name} resolves to no address")
    for address in addresses:
        problem = rule.refuse_address(tenant, f"{host}:{port}", address, port)
        if problem is not None:
            raise DestinationRefused(f"{name} resolved to {address}: {problem}")
    return addresses[0]


@dataclasses.dataclass(frozen=True)
class GitPin:
    """What holds git to one checked address: settings (`GIT_CONFIG_KEY_n`) and options
    added to its ssh command."""

    config: tuple[tuple[str, str], ...] = ()
    ssh_options: tuple[str, ...] = ()


def git_pin(scheme: str, host: Host, port: int, address: Address) -> GitPin:
    """The pin for a remote `scheme://host:port` checked to connect to `address`."""
    shown = f"[{address}]" if address.version == 6 else str(address)
    if scheme in ("http", "https"):
        config = [("http.followRedirects", "false"), ("http.proxy", "")]
        if host.name is not None:
            config.append(("http.curloptResolve", f"{host.name}:{port}:{shown}"))
        return GitPin(config=tuple(config))
    if scheme == "ssh" and host.name is not None:
        return GitPin(ssh_options=("-o", f"HostName={address}", "-o", f"HostKeyAlias={host.name}"))
    return GitPin()


def pinned_environment(env: Mapping[str, str], pin: GitPin) -> dict[str, str]:
    """`env` (the credential's variables for git) with `pin` added: its settings after any
    `env` already gives, and its ssh options after the ssh command `env` (or the
    supervisor's environment) names."""
    combined = dict(env)
    if pin.ssh_options:
        command = (
            combined.get("GIT_SSH_COMMAND")
            or os.environ.get("GIT_SSH_COMMAND")
            or "ssh -o BatchMode=yes"
        )
        combined["GIT_SSH_COMMAND"] = f"{command} {shlex.join(pin.ssh_options)}"
    count = int(combined.get("GIT_CONFIG_COUNT", "0"))
    for key, value in pin.config:
        combined[f"GIT_CONFIG_KEY_{count}"] = key
        combined[f"GIT_CONFIG_VALUE_{count}"] = value
        count += 1
    if count:
        combined["GIT_CONFIG_COUNT"] = str(count)
    return combined
