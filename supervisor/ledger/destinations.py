"""Where effects may be sent: the supervisor's setting `effect_allowed_hosts`, and per tenant
`effect_allowed_hosts_by_tenant` (docs/design.md, Effects: Destinations).

An entry is `host` or `host:port`: a name (`hooks.example.com`), every name under a domain
(`*.example.com`), every name and public address (`*`), or an address (`203.0.113.7`,
`[2001:db8::7]`). A tenant's effects may go where an entry of either list admits. Two rules:

- **Names and public addresses** are admitted by an entry that matches them (`*` matches all).
- **Internal addresses** (loopback, link-local -- the cloud metadata address 169.254.169.254
  among them --, private, unique-local, shared, reserved, multicast, unspecified, and IPv6
  spellings that carry one of those IPv4 addresses) are admitted only by an entry naming that
  very address: no wildcard and no name admits one, so a name whose DNS answer is an internal
  address is refused at send (a name's answer is not the operator's choice; the address is).

A host is read as the client will send it. Numeric spellings other than the dotted quad
(`0x7f000001`, `2130706433`, `017700000001`, `127.1`, a dotted quad with a trailing dot) are
refused outright: resolvers read them as addresses, and the list compares one spelling.
`localhost` and names under `.localhost` are refused too (they always name loopback): write
the address, and list it.

These are pure functions over plan text and addresses: the create check (`refuse_url`,
`refuse_remote`) never resolves a name; the dispatcher resolves once at send and checks each
address with `refuse_address` (supervisor/effects/addresses.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Final
from urllib.parse import urlsplit

import httpx

from tether.wire import templates

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

SETTING: Final = "effect_allowed_hosts"
TENANT_SETTING: Final = "effect_allowed_hosts_by_tenant"

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE: Final = ipaddress.IPv6Network("::/96")
_SHARED: Final = ipaddress.IPv4Network("100.64.0.0/10")
_UNIQUE_LOCAL: Final = ipaddress.IPv6Network("fc00::/7")
DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ssh": 22, "git": 9418}


class HostRefused(ValueError):
    """A host cannot be a destination whatever the list says (its spelling, or `localhost`)."""


def internal_kind(address: Address) -> str | None:
    """What kind of internal address `address` is ("a loopback address", ...), or None for a
    public one (globally routable, not multicast or reserved). An IPv6 address that carries
    an IPv4 one (mapped, compatible, 6to4, NAT64) is judged by the IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        carried = _carried_ipv4(address)
        if carried is not None:
            kind = internal_kind(carried)
            return None if kind is None else f"an IPv6 spelling of {carried}, {kind}"
    checks = (
        ("the unspecified address", address.is_unspecified),
        ("a loopback address", address.is_loopback),
        (
            "a link-local address (the cloud metadata address 169.254.169.254 is one)",
            address.is_link_local,
        ),
        ("a multicast address", address.is_multicast),
        ("a unique-local address", address in _UNIQUE_LOCAL),
        ("a shared address (carrier-grade NAT)", address in _SHARED),
        ("a private address", address.is_private),
        ("a reserved address", address.is_reserved),
        ("an address that is not globally routable", not address.is_global),
    )
    return next((kind for kind, found in checks if found), None)


def _carried_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def plain_address(address: Address) -> Address:
    """`address`, an IPv4-mapped IPv6 address as its IPv4 address (the same destination)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclasses.dataclass(frozen=True)
class Host:
    """A destination's host as the client sends it: a lower-case ASCII name without a
    trailing dot, or an address."""

    name: str | None = None
    address: Address | None = None

    def __str__(self) -> str:
        if self.address is None:
            return str(self.name)
        return f"[{self.address}]" if self.address.version == 6 else str(self.address)


def read_host(text: str) -> Host:
    """The host written `text` (brackets allowed around an IPv6 address); `HostRefused` for a
    numeric spelling other than the dotted quad, `localhost`, or text no host has."""
    host = text.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            return Host(address=plain_address(ipaddress.IPv6Address(host)))
        except ValueError:
            raise HostRefused(f"{text!r} is not an IPv6 address") from None
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        try:
            address = ipaddress.IPv4Address(name)
        except ValueError:
            address = None
        if address is None or str(address) != host:
            raise HostRefused(
                f"{text!r} is a numeric spelling of an address: write it as a dotted quad"
                " (for example 127.0.0.1)"
            )
        return Host(address=address)
    if not name or not all(_LABEL.fullmatch(label) for label in labels):
        raise HostRefused(f"{text!r} is not a host name (ASCII letters, digits, '-', '.')")
    if labels[-1] == "localhost":
        raise HostRefused(
            f"{text!r} always names a loopback address: write the address (127.0.0.1 or"
            " [::1]) instead, and list it"
        )
    return Host(name=name)


@dataclasses.dataclass(frozen=True)
class HostPattern:
    """One entry of `effect_allowed_hosts`: `*`, `*.<domain>`, a name or an address, with an
    optional port (any port without one)."""

    text: str
    name: str | None  # "*", "*.example.com", "example.com"; None for an address
    address: Address | None
    port: int | None

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        """The entry written `text`; `ValueError` saying what is wrong with it."""
        entry = text.strip()
        host, port = _split_port(entry)
        if host == "*" or host.startswith("*."):
            rest = host[2:]
            if rest and read_host(rest).name is None:
                raise ValueError(f"{entry!r}: '*.' is followed by a domain name, not an address")
            return cls(text=entry, name=host.lower(), address=None, port=port)
        found = read_host(host)
        return cls(text=entry, name=found.name, address=found.address, port=port)

    def _port_matches(self, port: int) -> bool:
        return self.port is None or self.port == port

    def admits(self, host: Host, port: int) -> bool:
        """Whether this entry admits `host` as written (a name, or a public address)."""
        if not self._port_matches(port):
            return False
        if host.address is not None:
            return self.names(host.address, port) or self.name == "*"
        if self.name == "*":
            return True
        if self.name is not None and self.name.startswith("*."):
            return str(host.name).endswith(self.name[1:])
        return self.name == host.name

    def names(self, address: Address, port: int) -> bool:
        """Whether this entry names `address` itself (the only way an internal one is
        admitted)."""
        return (
            self.address is not None
            and self._port_matches(port)
            and plain_address(address) == self.address
        )


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise ValueError(f"{entry!r}: an IPv6 address ends with ']'")
        host, rest = entry[: close + 1], entry[close + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"{entry!r}: only ':<port>' may follow ']'")
        return host, _port(entry, rest[1:])
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(entry, port)
    if ":" in entry:
        raise ValueError(f"{entry!r}: write an IPv6 address in brackets, like [2001:db8::1]:443")
    return entry, None


def _port(entry: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{entry!r}: the port must be 1..65535")
    return int(text)


ANY: Final = HostPattern(text="*", name="*", address=None, port=None)


def patterns(text: str | Iterable[str], where: str) -> tuple[HostPattern, ...]:
    """The entries of a comma-separated list (or of a list of strings); `ValueError` naming
    `where` and the entry at fault."""
    items = text.split(",") if isinstance(text, str) else list(text)
    found = []
    for item in items:
        if not item.strip():
            continue
        try:
            found.append(HostPattern.parse(item))
        except ValueError as exc:
            raise ValueError(f"setting {where!r}: {exc}") from None
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class Destinations:
    """The destinations effects may go to: `everyone`'s entries, plus each tenant's own. The
    default admits every name and public address and no internal one."""

    everyone: tuple[HostPattern, ...] = (ANY,)
    by_tenant: tuple[tuple[str, tuple[HostPattern, ...]], ...] = ()

    @classmethod
    def from_settings(cls, everyone: str, by_tenant: Mapping[str, str]) -> Destinations:
        """From the settings' text; `ValueError` naming the setting and the entry at fault."""
        tenants = tuple(
            (tenant, patterns(text, f"{TENANT_SETTING}.{tenant}"))
            for tenant, text in sorted(by_tenant.items())
        )
        return cls(everyone=patterns(everyone, SETTING), by_tenant=tenants)

    def entries_for(self, tenant: str) -> tuple[HostPattern, ...]:
        own = next((found for name, found in self.by_tenant if name == tenant), ())
        return self.everyone + own

    def _settings(self, tenant: str) -> str:
        return f"{SETTING} (or {TENANT_SETTING}.{tenant})"

    def refuse_host(self, tenant: str, host: Host, port: int) -> str | None:
        """Why `tenant`'s effect may not go to `host`:`port` as written, or None: a name or a
        public address needs an entry that admits it, an internal address one that names it
        (`refuse_address`)."""
        where = f"{host}:{port}"
        if host.address is not None and internal_kind(host.address) is not None:
            return self.refuse_address(tenant, where, host.address, port)
        if any(entry.admits(host, port) for entry in self.entries_for(tenant)):
            return None
        return (
            f"destination {where} is not allowed: no entry of setting {self._settings(tenant)}"
            f" admits it (add {host} or {where} there)"
        )

    def refuse_address(self, tenant: str, where: str, address: Address, port: int) -> str | None:
        """Why `tenant`'s effect to `where` (a host its entries admit) may not connect to
        `address`:`port`, or None: a public address may be connected to, an internal one only
        when an entry names it."""
        address = plain_address(address)
        kind = internal_kind(address)
        if kind is None or any(e.names(address, port) for e in self.entries_for(tenant)):
            return None
        return (
            f"destination {where} is not allowed: {address} is {kind}, and an"
            f" internal address is allowed only by an entry of setting {self._settings(tenant)}"
            f" that names it (such as {Host(address=address)}:{port})"
        )

    def refuse_url(self, tenant: str, url: str) -> str | None:
        """Why `tenant`'s `http` effect may not go to the URL template `url` (plan text:
        placeholders may fill its path and query, never its host), or None."""
        try:
            host, port = http_destination(templates.without_placeholders(url))
        except (HostRefused, ValueError) as exc:
            return f"destination refused: {exc}"
        return self.refuse_host(tenant, host, port)

    def refuse_remote(self, tenant: str, url: str) -> str | None:
        """Why `tenant`'s `git.push` may not go to the repository URL `url`, or None. A path
        or `file://` remote is on this box, chosen by whoever ran `repo add`: no network
        destination, not judged here."""
        try:
            found = remote_destination(url)
        except (HostRefused, ValueError) as exc:
            return f"destination refused: {exc}"
        if found is None:
            return None
        _, host, port = found
        return self.refuse_host(tenant, host, port)


# The default: every name and public address, no internal one.
PUBLIC_HOSTS: Final = Destinations()


def http_destination(url: str) -> tuple[Host, int]:
    """The host and port an `http` effect's `url` connects to, read by httpx as it sends it;
    `ValueError` (or `HostRefused`) when it has none or one that is refused."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"the URL cannot be read: {exc}") from None
    scheme = parsed.scheme
    if scheme not in ("http", "https") or not parsed.raw_host:
        raise ValueError("the URL is not an http:// or https:// URL with a host")
    host = read_host(parsed.raw_host.decode("ascii"))
    return host, parsed.port or DEFAULT_PORTS[scheme]


_SCP_LIKE = re.compile(r"(?:[^@/]*@)?(?P<host>\[[^\]]*\]|[^:/\[\]]+):(?!//)")


def remote_destination(url: str) -> tuple[str, Host, int] | None:
    """(scheme, host, port) of a git remote that is reached over the network: `ssh://`,
    `git://`, `http(s)://` or scp-like `[user@]host:path` (scheme `ssh`); None for a path or
    `file://`. `ValueError` for a network URL without a usable host."""
    if url.startswith("/") or url.lower().startswith("file://"):
        return None
    if "://" in url:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise ValueError(f"a repository URL of scheme {scheme!r} has no known port")
        netloc = parts.netloc.rpartition("@")[2]
        host_text, port_text = _host_and_port(netloc)
        if not host_text:
            raise ValueError("the repository URL names no host")
        return scheme, read_host(host_text), int(port_text) if port_text else DEFAULT_PORTS[scheme]
    scp = _SCP_LIKE.match(url)
    if scp is None:
        return None
    return "ssh", read_host(scp["host"]), DEFAULT_PORTS["ssh"]


def _host_and_port(netloc: str) -> tuple[str, str]:
    if netloc.startswith("["):
        host, _, rest = netloc.partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        return host + "]", port
    host, _, port = netloc.partition(":")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"the repository URL's port {port!r} is not 1..65535")
    return host, port
