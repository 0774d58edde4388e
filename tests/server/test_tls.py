"""A client certificate's principal: its subject as an RFC 2253 name, mapped as Kafka's rules map it."""

from __future__ import annotations

from typing import Any

import pytest

from oncelog.server.tls import ANONYMOUS, certificate_principal, distinguished_name, parse_principal_rule

# What ssl.SSLSocket.getpeercert() returns: the subject's RDNs, least specific first.
CERTIFICATE: dict[str, Any] = {
    "subject": (
        (("countryName", "US"),),
        (("organizationName", "Example, Inc."),),
        (("organizationalUnitName", "ops"),),
        (("commonName", "billing-service"),),
    )
}


def test_the_subject_is_named_most_specific_part_first_with_rfc_2253_escapes() -> None:
    assert distinguished_name(CERTIFICATE) == r"CN=billing-service,OU=ops,O=Example\, Inc.,C=US"
    assert certificate_principal(CERTIFICATE) == r"User:CN=billing-service,OU=ops,O=Example\, Inc.,C=US"


def test_no_certificate_is_the_anonymous_principal() -> None:
    assert certificate_principal(None) == certificate_principal({}) == ANONYMOUS


def test_the_first_rule_that_matches_the_whole_name_maps_it() -> None:
    rules = (
        parse_principal_rule("RULE:^CN=([^,]+),OU=admins.*$/admin-$1/"),
        parse_principal_rule("RULE:^CN=([^,]+),.*$/$1/U"),
        parse_principal_rule("DEFAULT"),
    )
    assert certificate_principal(CERTIFICATE, rules) == "User:BILLING-SERVICE"
    assert certificate_principal(CERTIFICATE, rules[:1]) == f"User:{distinguished_name(CERTIFICATE)}"
    assert certificate_principal(CERTIFICATE, (rules[2],)) == f"User:{distinguished_name(CERTIFICATE)}"


@pytest.mark.parametrize("text", ["RULE:^CN=(.*$/$1/", "RULE:no-slashes", "CN=x", "RULE:a/b/X"])
def test_a_malformed_rule_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_principal_rule(text)
