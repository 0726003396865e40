"""--web.config.file in the Prometheus exporter-toolkit format: TLS and basic auth.

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                         # optional
      min_version: TLS12                             # optional
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # optional, TLS 1.2
      prefer_server_cipher_suites: true              # optional
      curve_preferences: [X25519]                    # optional, one curve
    basic_auth_users:
      alice: $2y$10$...                              # bcrypt hash
    http_server_config:
      headers:                                       # optional, sent on every answer
        Strict-Transport-Security: max-age=31536000

Relative paths are relative to the file, as in exporter-toolkit. What cannot be
honored is refused with one line, never ignored: more than one curve (Python's ssl
module sets one), and headers exporter-toolkit does not allow either.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import bcrypt

from wattprint.config import yamlfile

if TYPE_CHECKING:  # imported when the config has TLS: ssl costs ~8 ms at start
    import ssl


class WebConfigError(ValueError):
    """str() is one line naming the file and the bad value."""


# Names in ssl.TLSVersion and of ssl's CERT_* constants.
_TLS_VERSIONS = {"TLS10": "TLSv1", "TLS11": "TLSv1_1", "TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
_CLIENT_AUTH = {
    "NoClientCert": "CERT_NONE",
    "RequestClientCert": "CERT_OPTIONAL",
    "RequireAnyClientCert": "CERT_REQUIRED",
    "VerifyClientCertIfGiven": "CERT_OPTIONAL",
    "RequireAndVerifyClientCert": "CERT_REQUIRED",
}
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
}
_TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
# Go's cipher suite names (crypto/tls), as exporter-toolkit takes them, to OpenSSL's.
# TLS 1.3 suites are not configurable in Go either: accepted, and they change nothing.
_CIPHERS = {
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": "",
    "TLS_AES_256_GCM_SHA384": "",
    "TLS_CHACHA20_POLY1305_SHA256": "",
}
_CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}
# exporter-toolkit's list: only these headers, and for two of them only these values.
_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
# $2a$, $2b$ or $2y$ (htpasswd -B), a two-digit cost, then 53 characters of salt and hash.
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")

Authorize = Callable[[str | None], bool]

# Each bcrypt check doubles in time with the cost: 10 (htpasswd's default) takes ~60 ms
# here, 14 about a second, 20 over a minute and 31 days. A scrape is answered within
# its timeout, so a higher cost is refused at start, not found out by a hung check.
MAX_BCRYPT_COST = 14


class WebConfig(NamedTuple):
    """What --web.config.file sets up: the basic-auth check, the TLS context, extra headers."""

    authorize: Authorize | None
    tls: ssl.SSLContext | None
    headers: dict[str, str]


def _path(base: str, value: Any, what: str, source: str) -> str:
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"{source}: {what} must be a file path")
    path = value if os.path.isabs(value) else os.path.join(base, value)
    if not os.path.isfile(path):
        raise WebConfigError(f"{source}: {what} {value} not found")
    return path


def _tls_context(tls: Mapping[str, Any], base: str, source: str) -> ssl.SSLContext:
    unknown = set(tls) - _TLS_KEYS
    if unknown:
        raise WebConfigError(f"{source}: unknown tls_server_config key {sorted(unknown)[0]!r}")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise WebConfigError(f"{source}: tls_server_config needs cert_file and key_file")
    for name in ("min_version", "max_version", "client_auth_type"):
        if name in tls and not isinstance(tls[name], str):
            raise WebConfigError(f"{source}: {name} must be a name, not {tls[name]!r}")
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert = _path(base, tls["cert_file"], "cert_file", source)
    key = _path(base, tls["key_file"], "key_file", source)
    _load_cert_chain(context, cert, key, source)
    minimum = tls.get("min_version", "TLS12")
    if minimum not in _TLS_VERSIONS:
        raise WebConfigError(
            f"{source}: min_version {minimum!r} is not one of {', '.join(_TLS_VERSIONS)}"
        )
    context.minimum_version = ssl.TLSVersion[_TLS_VERSIONS[minimum]]
    if "max_version" in tls:
        if tls["max_version"] not in _TLS_VERSIONS:
            raise WebConfigError(
                f"{source}: max_version {tls['max_version']!r} is not one of "
                f"{', '.join(_TLS_VERSIONS)}"
            )
        context.maximum_version = ssl.TLSVersion[_TLS_VERSIONS[tls["max_version"]]]
        if context.maximum_version < context.minimum_version:
            # Every handshake would fail, and nothing would say why.
            raise WebConfigError(
                f"{source}: max_version {tls['max_version']} is below min_version {minimum}"
            )
    auth_type = tls.get("client_auth_type", "NoClientCert")
    if auth_type not in _CLIENT_AUTH:
        raise WebConfigError(
            f"{source}: client_auth_type {auth_type!r} is not one of {', '.join(_CLIENT_AUTH)}"
        )
    if tls.get("client_ca_file"):
        ca = _path(base, tls["client_ca_file"], "client_ca_file", source)
        try:
            context.load_verify_locations(ca)
        except (ssl.SSLError, OSError) as err:
            raise WebConfigError(f"{source}: cannot load client_ca_file: {err}") from None
    elif auth_type != "NoClientCert":
        # Python's TLS stack verifies every client certificate it accepts, so even
        # RequestClientCert and RequireAnyClientCert need a CA to verify against.
        raise WebConfigError(f"{source}: client_auth_type {auth_type} needs client_ca_file")
    context.verify_mode = ssl.VerifyMode[_CLIENT_AUTH[auth_type]]
    _ciphers_and_curves(context, tls, source)
    return context


def _load_cert_chain(context: ssl.SSLContext, cert: str, key: str, source: str) -> None:
    """OpenSSL says "[SSL] PEM lib" for every kind of bad file; say which file and why."""
    import ssl

    try:
        with open(cert, "rb") as handle:
            cert_text = handle.read()
        with open(key, "rb") as handle:
            key_text = handle.read()
    except OSError as err:
        raise WebConfigError(f"{source}: cannot read {err.filename}: {err.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in cert_text:
        raise WebConfigError(f"{source}: cert_file {cert} holds no PEM certificate")
    if not re.search(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----", key_text):
        raise WebConfigError(f"{source}: key_file {key} holds no PEM private key")
    if b"ENCRYPTED" in key_text:
        raise WebConfigError(f"{source}: key_file {key} is encrypted; give it unencrypted")
    try:
        # The password callback keeps OpenSSL from ever prompting on a terminal.
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as err:
        if err.reason == "KEY_VALUES_MISMATCH":
            raise WebConfigError(f"{source}: key_file {key} is not the key of {cert}") from None
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cert)
        except ssl.SSLError:
            raise WebConfigError(f"{source}: cert_file {cert} is not a valid certificate") from None
        raise WebConfigError(f"{source}: key_file {key} is not a valid private key") from None


def _ciphers_and_curves(context: ssl.SSLContext, tls: Mapping[str, Any], source: str) -> None:
    import ssl

    suites = tls.get("cipher_suites") or []
    if not isinstance(suites, list) or not all(isinstance(s, str) for s in suites):
        raise WebConfigError(f"{source}: cipher_suites must be a list of cipher suite names")
    for suite in suites:
        if suite not in _CIPHERS:
            raise WebConfigError(
                f"{source}: cipher_suites: unknown cipher suite {suite!r} "
                "(Go's names, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)"
            )
    names = [_CIPHERS[s] for s in suites if _CIPHERS[s]]
    if names:
        try:
            context.set_ciphers(":".join(names))
        except ssl.SSLError:
            raise WebConfigError(
                f"{source}: cipher_suites: none of {', '.join(suites)} is available here"
            ) from None
    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise WebConfigError(f"{source}: prefer_server_cipher_suites must be true or false")
    if prefer:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    curves = tls.get("curve_preferences") or []
    if not isinstance(curves, list) or any(
        not isinstance(c, str) or c not in _CURVES for c in curves
    ):
        raise WebConfigError(
            f"{source}: curve_preferences must list curves of {', '.join(_CURVES)}"
        )
    if len(curves) > 1:
        raise WebConfigError(
            f"{source}: curve_preferences: give one curve; Python's ssl module cannot "
            "offer several in an order"
        )
    if curves:
        context.set_ecdh_curve(_CURVES[curves[0]])


def _headers(config: Any, source: str) -> dict[str, str]:
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise WebConfigError(f"{source}: http_server_config must be a mapping")
    unknown = set(config) - {"headers", "http2"}
    if unknown:
        raise WebConfigError(f"{source}: unknown http_server_config key {sorted(unknown)[0]!r}")
    # HTTP/2 is never offered (no ALPN h2): clients speak HTTP/1.1 either way.
    if not isinstance(config.get("http2", True), bool):
        raise WebConfigError(f"{source}: http_server_config.http2 must be true or false")
    headers = config.get("headers") or {}
    if not isinstance(headers, dict):
        raise WebConfigError(f"{source}: http_server_config.headers must be a mapping")
    for name, value in headers.items():
        if name not in _HEADERS:
            raise WebConfigError(
                f"{source}: http_server_config.headers: {name!r} cannot be set "
                f"(only {', '.join(_HEADERS)})"
            )
        if not isinstance(value, str) or not value.isprintable():
            raise WebConfigError(f"{source}: http_server_config.headers[{name!r}] must be text")
        if _HEADERS[name] and value not in _HEADERS[name]:
            raise WebConfigError(
                f"{source}: http_server_config.headers[{name!r}] must be one of "
                f"{', '.join(_HEADERS[name])}, not {value!r}"
            )
    return {str(k): str(v) for k, v in headers.items()}


def _basic_auth(users: Any, source: str) -> Authorize:
    if not isinstance(users, dict) or not users:
        raise WebConfigError(f"{source}: basic_auth_users must map user names to bcrypt hashes")
    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise WebConfigError(f"{source}: basic_auth_users[{user!r}] is not a bcrypt hash")
        cost = int(hashed[4:6])
        if cost > MAX_BCRYPT_COST:
            raise WebConfigError(
                f"{source}: basic_auth_users[{user!r}] has bcrypt cost {cost}, over "
                f"{MAX_BCRYPT_COST}: each check would take {2 ** (cost - 10) * 0.06:.0f} s "
                "or more (htpasswd -B -C 10)"
            )
        hashes[str(user)] = hashed.encode()
    # bcrypt is slow on purpose (~50-250 ms); remember digests of credentials that
    # passed so a 1 s scrape does not burn a core, and bound the memory it takes.
    accepted: OrderedDict[bytes, None] = OrderedDict()
    lock = threading.Lock()
    # Unknown users are checked against the costliest real hash (its answer thrown
    # away), so the answer's timing does not tell which user names exist; nothing is
    # hashed at start.
    dummy = max(hashes.values(), key=lambda h: int(h[4:6]))

    def authorize(header: str | None) -> bool:
        scheme, _, credentials = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        if not sep:
            return False
        digest = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        with lock:
            for known in accepted:
                if hmac.compare_digest(known, digest):
                    accepted.move_to_end(known)
                    return True
        hashed = hashes.get(user)
        secret = password.encode()
        # bcrypt reads at most 72 bytes (and bcrypt>=5 raises beyond); no stored
        # password is longer, so a longer one is wrong. Hash anyway to keep the timing.
        too_long = len(secret) > 72
        ok = bcrypt.checkpw(secret[:72], hashed if hashed else dummy)
        ok = ok and hashed is not None and not too_long
        if ok:
            with lock:
                accepted[digest] = None
                while len(accepted) > 64:
                    accepted.popitem(last=False)
        return ok

    return authorize


def load_web_config(path: str) -> WebConfig:
    try:
        data = yamlfile.load(path)
    except OSError as err:
        raise WebConfigError(f"cannot read --web.config.file {path}: {err.strerror}") from None
    except yamlfile.YamlFileError as err:
        raise WebConfigError(f"--web.config.file {path} {err}") from None
    source = f"--web.config.file {path}"
    if data is None:
        return WebConfig(None, None, {})
    if not isinstance(data, dict):
        raise WebConfigError(f"{source}: must be a YAML mapping")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise WebConfigError(f"{source}: unknown key {sorted(unknown)[0]!r}")
    base = os.path.dirname(os.path.abspath(path))
    tls = None
    if data.get("tls_server_config"):
        if not isinstance(data["tls_server_config"], dict):
            raise WebConfigError(f"{source}: tls_server_config must be a mapping")
        tls = _tls_context(data["tls_server_config"], base, source)
    authorize = None
    if data.get("basic_auth_users") is not None:
        authorize = _basic_auth(data["basic_auth_users"], source)
    return WebConfig(authorize, tls, _headers(data.get("http_server_config"), source))
