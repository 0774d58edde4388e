"""Listeners (`NAME://HOST:PORT`), what each advertises, and which a stranger can reach."""

from __future__ import annotations

import pytest

from oncelog.server.listeners import (
    PLAINTEXT,
    SASL_PLAINTEXT,
    SASL_SSL,
    SSL,
    Listener,
    parse_listener,
    with_advertised,
)


def test_a_listener_is_named_by_its_security_protocol() -> None:
    listener = parse_listener("sasl_ssl://[::1]:9093")
    assert (listener.name, listener.host, listener.port) == (SASL_SSL, "::1", 9093)
    assert listener.uses_tls and listener.uses_sasl and str(listener) == "SASL_SSL://[::1]:9093"
    assert not parse_listener("PLAINTEXT://h:1").uses_tls and parse_listener("SSL://h:1").uses_tls
    assert parse_listener("SASL_PLAINTEXT://h:1").uses_sasl and not parse_listener("SSL://h:1").uses_sasl


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("INTERNAL://h:9092", "listener name must be one of"),
        ("h:9092", "expected NAME://HOST:PORT"),
        ("SSL://h:99999", "port in 0..65535"),
        ("SSL://:9092", "expected HOST:PORT"),
    ],
)
def test_a_malformed_listener_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_listener(text)


def test_advertise_names_its_listener_or_is_bare_for_a_single_one() -> None:
    plain, sasl = Listener(PLAINTEXT, "127.0.0.1", 9092), Listener(SASL_SSL, "0.0.0.0", 9093)
    [single] = with_advertised([plain], ["broker-1:19092"])
    assert single.advertised == ("broker-1", 19092)
    both = with_advertised([plain, sasl], ["SASL_SSL://broker-1.example.com:9093"])
    assert [listener.advertised for listener in both] == [("127.0.0.1", 9092), ("broker-1.example.com", 9093)]
    with pytest.raises(ValueError, match="name one"):
        with_advertised([plain, sasl], ["broker-1:9093"])
    with pytest.raises(ValueError, match="there is no SSL listener"):
        with_advertised([plain, sasl], ["SSL://b:1"])
    with pytest.raises(ValueError, match="once"):
        with_advertised([plain, Listener(PLAINTEXT, "127.0.0.2", 1)], [])


def test_a_port_chosen_by_the_kernel_is_advertised_unless_told_otherwise() -> None:
    assert Listener(SSL, "127.0.0.1", 0).bound_to(40001).advertised == ("127.0.0.1", 40001)
    told = Listener(SSL, "127.0.0.1", 0, advertise_host="relay", advertise_port=7).bound_to(40001)
    assert (told.port, told.advertised) == (40001, ("relay", 7))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.5.6.7", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("broker.example.com", False),
    ],
)
def test_only_loopback_addresses_count_as_unreachable_from_other_machines(host: str, loopback: bool) -> None:
    assert Listener(SASL_PLAINTEXT, host, 9092).loopback_only is loopback
