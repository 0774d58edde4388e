"""TLS for the SSL and SASL_SSL listeners (the standard library's `ssl`).

TLS 1.2 and later, no TLS compression (CRIME). With a CA file, every client of an SSL
listener must show a certificate it signed (mTLS, Kafka's ssl.client.auth=required; a
SASL_SSL listener asks for none, the login names the client), and the certificate's
subject is the client's principal: `User:` and the subject as an RFC 2253 distinguished
name, most specific part first (`User:CN=alice,OU=ops,O=example`), as Kafka's default
principal builder names it (an attribute RFC 2253 gives no short name keeps Python's
name, `emailAddress=...`, where Java writes its OID and hex value).
`--ssl-principal-rule` maps that name as Kafka's ssl.principal.mapping.rules do:
`RULE:pattern/replacement/` (optionally followed by L or U to lower- or upper-case the
result), tried in order, the first whose pattern matches the whole name wins; `DEFAULT`
keeps the name as it is. A replacement naming a group its pattern lacks is refused.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from typing import Any, Final

ANONYMOUS: Final = "User:ANONYMOUS"
# RFC 4514 / 2253 short names of the attributes Python reports by their long names.
_SHORT_NAMES: Final = {
    "commonName": "CN",
    "organizationalUnitName": "OU",
    "organizationName": "O",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "countryName": "C",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_RULE = re.compile(r"^RULE:(?P<pattern>(?:\\.|[^/])*)/(?P<replacement>(?:\\.|[^/])*)/(?P<case>[LU]?)$")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str
    key: str
    # Clients must present a certificate this CA signed; None: no client certificates.
    ca: str | None = None


def server_context(files: TlsFiles, *, client_certificates: bool) -> ssl.SSLContext:
    """A server context for `files`, asking every client for a certificate the CA signed if
    `client_certificates` (and there is a CA); OSError or ssl.SSLError if a file is unusable."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    context.load_cert_chain(files.cert, files.key)
    if client_certificates and files.ca is not None:
        context.load_verify_locations(cafile=files.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def distinguished_name(certificate: dict[str, Any]) -> str:
    """The subject of a certificate as `getpeercert()` gives it, as an RFC 2253 name."""
    parts = []
    for rdn in reversed(certificate.get("subject", ())):
        parts.append("+".join(f"{_SHORT_NAMES.get(key, key)}={_escaped(value)}" for key, value in rdn))
    return ",".join(parts)


def _escaped(value: str) -> str:
    escaped = re.sub(r'([,+"\\<>;=])', r"\\\1", value)
    if escaped.startswith((" ", "#")):
        escaped = "\\" + escaped
    if escaped.endswith(" ") and not escaped.endswith("\\ "):
        escaped = escaped[:-1] + "\\ "
    return escaped


@dataclass(frozen=True, slots=True)
class PrincipalRule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        match = self.pattern.fullmatch(name)
        if match is None:
            return None
        mapped = match.expand(re.sub(r"\$(\d)", r"\\\1", self.replacement))
        return mapped.lower() if self.case == "L" else mapped.upper() if self.case == "U" else mapped


def parse_principal_rule(text: str) -> PrincipalRule:
    """A Kafka ssl.principal.mapping.rules entry; ValueError saying what is wrong."""
    if text.strip() == "DEFAULT":
        return PrincipalRule(None)
    match = _RULE.match(text.strip())
    if match is None:
        raise ValueError(f"expected DEFAULT or RULE:pattern/replacement/[L|U], got {text!r}")
    try:
        pattern = re.compile(match["pattern"])
    except re.error as exc:
        raise ValueError(f"{text!r}: the pattern is not a regular expression: {exc}") from exc
    groups = [int(number) for number in re.findall(r"\$(\d)", match["replacement"])]
    if any(number > pattern.groups for number in groups):
        raise ValueError(
            f"{text!r}: the replacement names group ${max(groups)}; the pattern has {pattern.groups}"
        )
    return PrincipalRule(pattern, match["replacement"], match["case"])


def certificate_principal(certificate: dict[str, Any] | None, rules: tuple[PrincipalRule, ...] = ()) -> str:
    """The principal of a client that showed `certificate` (None: it showed none)."""
    if not certificate:
        return ANONYMOUS
    name = distinguished_name(certificate)
    for rule in rules or (PrincipalRule(None),):
        mapped = rule.apply(name)
        if mapped is not None:
            return f"User:{mapped}"
    return f"User:{name}"  # no rule matched: Kafka keeps the name as it is
