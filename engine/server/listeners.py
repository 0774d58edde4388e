"""Where `oncelog serve` listens, and what each listener asks of a client.

A listener is Kafka's `NAME://HOST:PORT`, its name one of Kafka's four security
protocols, which says what a connection to it must go through before any other API:

| name | TLS | SASL | the principal |
|---|---|---|---|
| PLAINTEXT | no | no | User:ANONYMOUS |
| SSL | yes | no | the client certificate's subject (mTLS), else User:ANONYMOUS |
| SASL_PLAINTEXT | no | yes | the SASL user |
| SASL_SSL | yes | yes | the SASL user |

Each listener advertises its own address (Metadata, FindCoordinator and DescribeCluster
tell a client the address of the listener it came in on, as Kafka's
advertised.listeners does per listener name): a client that came in over TLS is sent
on over TLS.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from typing import Final

PLAINTEXT: Final = "PLAINTEXT"
SSL: Final = "SSL"
SASL_PLAINTEXT: Final = "SASL_PLAINTEXT"
SASL_SSL: Final = "SASL_SSL"
SECURITY_PROTOCOLS: Final = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    host: str
    port: int
    # What Metadata tells a client that came in here; the listen address if None.
    advertise_host: str | None = None
    advertise_port: int | None = None

    def __post_init__(self) -> None:
        if self.name not in SECURITY_PROTOCOLS:
            raise ValueError(
                f"listener name must be one of {', '.join(SECURITY_PROTOCOLS)}, got {self.name!r}"
            )
        for port in (self.port, self.advertise_port):
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"listener {self.name}: port must be 0..65535, got {port}")

    @property
    def uses_tls(self) -> bool:
        return self.name in (SSL, SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self.name in (SASL_PLAINTEXT, SASL_SSL)

    @property
    def advertised(self) -> tuple[str, int]:
        host = self.advertise_host or self.host
        port = self.advertise_port if self.advertise_port is not None else self.port
        return host, port

    @property
    def loopback_only(self) -> bool:
        """True when only this machine can reach it (a loopback address or `localhost`)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a name: it may resolve to anything

    def bound_to(self, port: int) -> Listener:
        """This listener on the port the kernel chose (port 0), advertising it unless told otherwise."""
        if self.port != 0:
            return self
        advertise_port = self.advertise_port if self.advertise_port is not None else port
        return replace(self, port=port, advertise_port=advertise_port)

    def __str__(self) -> str:
        return f"{self.name}://{format_address(self.host, self.port)}"


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) as (host, port); ValueError saying what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected HOST:PORT with a port in 0..65535, got {text!r}")
    return host.strip("[]"), int(port_text)


def parse_listener(text: str) -> Listener:
    """`NAME://HOST:PORT` as a Listener; ValueError saying what is wrong."""
    name, sep, address = text.partition("://")
    if not sep:
        raise ValueError(
            f"expected NAME://HOST:PORT (NAME one of {', '.join(SECURITY_PROTOCOLS)}), got {text!r}"
        )
    host, port = parse_address(address)
    return Listener(name.upper(), host, port)


def with_advertised(listeners: list[Listener], advertised: list[str]) -> list[Listener]:
    """`listeners` with `--advertise` applied: `NAME://HOST:PORT` for the listener of that name,
    or a bare `HOST:PORT` when there is only one listener."""
    by_name = {listener.name: listener for listener in listeners}
    if len(by_name) != len(listeners):
        raise ValueError("each listener name may be given once")
    for text in advertised:
        if "://" in text:
            target = parse_listener(text)
            if target.name not in by_name:
                raise ValueError(f"--advertise {text}: there is no {target.name} listener")
        elif len(listeners) == 1:
            host, port = parse_address(text)
            target = Listener(listeners[0].name, host, port)
        else:
            raise ValueError(f"--advertise {text}: with several listeners, name one (NAME://HOST:PORT)")
        if target.port == 0:
            raise ValueError(f"--advertise {text}: clients cannot connect to port 0")
        by_name[target.name] = replace(
            by_name[target.name], advertise_host=target.host, advertise_port=target.port
        )
    return [by_name[listener.name] for listener in listeners]
