"""--web.config.file (Prometheus exporter-toolkit format) against real clients: basic
auth with bcrypt hashes, TLS, client certificates, /healthz left open for probes, and
a bad file refused at start with exit status 2 and one line."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import requests

from conftest import seconds_until_cut_off
from wattprint.export import server as server_module
from wattprint.export import webconfig
from wattprint.export.collector import SnapshotCollector
from wattprint.export.server import ExporterApp, ExporterServer
from wattprint.export.webconfig import WebConfigError, load_web_config

USER, PASSWORD = "prometheus", "s3cret-scrape-pass"
TLS_ERRORS = (requests.exceptions.SSLError, requests.exceptions.ConnectionError)


# -- certificates, made in the test -------------------------------------------------


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client: tuple[str, str]  # (cert, key) signed by the CA
    rogue: tuple[str, str]  # (cert, key) signed by another CA


def _pki_with_cryptography(d: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def write(name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        (d / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def issue(
        name: str,
        issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
        extensions: list[tuple[x509.ExtensionType, bool]],
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        signer_cert, signer_key = issuer if issuer else (None, key)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(signer_cert.subject if signer_cert else subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()),
                False,
            )
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical)
        cert = builder.sign(signer_key, hashes.SHA256())
        write(name, cert, key)
        return cert, key

    def ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        return issue(name, None, [(x509.BasicConstraints(True, None), True), (usage, True)])

    def leaf(name: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]) -> None:
        server = name == "server"
        san = x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        )
        eku = x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
        )
        issue(
            name, issuer, [(x509.BasicConstraints(False, None), True), (san, False), (eku, False)]
        )

    authority = ca("ca")
    leaf("server", authority)
    leaf("client", authority)
    leaf("rogue", ca("rogue-ca"))


def _pki_with_openssl(d: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign"]
    for ca in ("ca", "rogue-ca"):
        run("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "1",
            "-subj", f"/CN={ca}", *ca_ext)  # fmt: skip
    for name, ca, usage in (
        ("server", "ca", "serverAuth"),
        ("client", "ca", "clientAuth"),
        ("rogue", "rogue-ca", "clientAuth"),
    ):
        (d / f"{name}.ext").write_text(
            f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n"
        )
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        sign = ["-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "1"]
        run("x509", "-req", "-in", f"{name}.csr", *sign, "-out", f"{name}.crt",
            "-extfile", f"{name}.ext")  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.fail("neither the cryptography package nor the openssl command is available")
        _pki_with_openssl(d)
    else:
        _pki_with_cryptography(d)
    return Pki(
        ca=d / "ca.crt",
        server_cert=d / "server.crt",
        server_key=d / "server.key",
        client=(str(d / "client.crt"), str(d / "client.key")),
        rogue=(str(d / "rogue.crt"), str(d / "rogue.key")),
    )


# -- the exporter's HTTP server with a web config -------------------------------------


def bcrypt_hash(password: str, rounds: int = 4) -> str:
    # Cost 4 keeps the suite fast; operators use 10 or more (see docs/security.md).
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()


def write_config(directory: Path, text: str) -> Path:
    path = directory / "web.yml"
    path.write_text(text)
    return path


def tls_block(pki: Pki, extra: str = "") -> str:
    return (
        "tls_server_config:\n"
        f"  cert_file: {pki.server_cert}\n"
        f"  key_file: {pki.server_key}\n" + extra
    )


@pytest.fixture
def serve() -> Iterator[Callable[[Path], str]]:
    servers: list[ExporterServer] = []

    def start(config: Path) -> str:
        authorize, tls, headers = load_web_config(str(config))
        app = ExporterApp(SnapshotCollector(lambda: None).render, lambda: True, authorize, headers)
        server = ExporterServer("127.0.0.1:0", app, tls)
        server.start()
        servers.append(server)
        scheme = "https" if tls is not None else "http"
        return f"{scheme}://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        server.stop()


def client() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


def test_basic_auth_over_tls(tmp_path: Path, pki: Pki, serve: Callable[[Path], str]) -> None:
    config = write_config(
        tmp_path, tls_block(pki) + f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n"
    )
    url = serve(config)
    http = client()
    http.verify = str(pki.ca)

    refused = http.get(f"{url}/metrics", timeout=5)
    assert refused.status_code == 401
    assert refused.headers["WWW-Authenticate"].startswith("Basic")
    assert "wattprint_" not in refused.text
    for user, password in [(USER, "wrong"), ("someone", PASSWORD), (USER, PASSWORD * 10)]:
        assert http.get(f"{url}/metrics", auth=(user, password), timeout=5).status_code == 401
    assert http.get(f"{url}/", timeout=5).status_code == 401

    ok = http.get(f"{url}/metrics", auth=(USER, PASSWORD), timeout=5)
    assert ok.status_code == 200 and "wattprint_build_info" in ok.text
    # The scheme name is case-insensitive (RFC 7235).
    header = requests.auth._basic_auth_str(USER, PASSWORD).replace("Basic", "basic")
    assert http.get(f"{url}/metrics", headers={"Authorization": header}, timeout=5).ok
    # Probes carry no credentials: /healthz stays open.
    assert http.get(f"{url}/healthz", timeout=5).status_code == 200

    # Plain HTTP to the TLS port gets no answer at all.
    with pytest.raises(requests.exceptions.ConnectionError):
        client().get(url.replace("https:", "http:") + "/metrics", auth=(USER, PASSWORD), timeout=5)
    # Nor does a client that cannot verify the server.
    with pytest.raises(requests.exceptions.SSLError):
        client().get(f"{url}/metrics", auth=(USER, PASSWORD), timeout=5)


def test_basic_auth_without_tls(tmp_path: Path, serve: Callable[[Path], str]) -> None:
    url = serve(write_config(tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n"))
    assert client().get(f"{url}/metrics", timeout=5).status_code == 401
    assert client().get(f"{url}/metrics", auth=(USER, PASSWORD), timeout=5).status_code == 200
    assert client().get(f"{url}/healthz", timeout=5).status_code == 200


def test_htpasswd_2y_hashes_are_accepted(tmp_path: Path, serve: Callable[[Path], str]) -> None:
    # htpasswd -B writes $2y$, the form the exporter-toolkit documentation shows.
    hashed = bcrypt_hash(PASSWORD).replace("$2b$", "$2y$", 1)
    url = serve(write_config(tmp_path, f"basic_auth_users:\n  {USER}: '{hashed}'\n"))
    assert client().get(f"{url}/metrics", auth=(USER, PASSWORD), timeout=5).status_code == 200


def test_unknown_users_cost_as_much_as_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown user is checked against a hash of the configured cost, so the time an
    answer takes does not tell which user names exist."""
    config = write_config(tmp_path, f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD, 5)}\n")
    authorize, _, _ = load_web_config(str(config))
    assert authorize is not None
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def checkpw(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", checkpw)
    header = requests.auth._basic_auth_str("nobody", PASSWORD)
    assert not authorize(header)
    assert [h[:7] for h in checked] == [b"$2b$05$"]


def test_min_version_refuses_older_clients(
    tmp_path: Path, pki: Pki, serve: Callable[[Path], str]
) -> None:
    url = serve(write_config(tmp_path, tls_block(pki, "  min_version: TLS13\n")))
    port = int(url.rsplit(":", 1)[1])

    def get(maximum: ssl.TLSVersion) -> int:
        context = ssl.create_default_context(cafile=str(pki.ca))
        context.maximum_version = maximum
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
        try:
            connection.request("GET", "/metrics")
            return connection.getresponse().status
        finally:
            connection.close()

    assert get(ssl.TLSVersion.TLSv1_3) == 200
    with pytest.raises(ssl.SSLError):
        get(ssl.TLSVersion.TLSv1_2)


def handshake(port: int, ca: Path, configure: Callable[[ssl.SSLContext], None]) -> str:
    """The cipher a client configured so agrees on with the server (SSLError: none)."""
    context = ssl.create_default_context(cafile=str(ca))
    configure(context)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        cipher = tls.cipher()
        assert cipher is not None
        return cipher[0]


def tls12_offering(*ciphers: str) -> Callable[[ssl.SSLContext], None]:
    def configure(context: ssl.SSLContext) -> None:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(":".join(ciphers))

    return configure


AES128, AES256 = "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384"


def test_cipher_suites_are_honored(tmp_path: Path, pki: Pki, serve: Callable[[Path], str]) -> None:
    only = "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n"
    port = int(serve(write_config(tmp_path, tls_block(pki, only))).rsplit(":", 1)[1])
    assert handshake(port, pki.ca, tls12_offering(AES128, AES256)) == AES256
    with pytest.raises(ssl.SSLError):
        handshake(port, pki.ca, tls12_offering(AES128))


@pytest.mark.parametrize(("prefer", "chosen"), [("true", AES256), ("false", AES128)])
def test_prefer_server_cipher_suites_is_honored(
    tmp_path: Path, pki: Pki, serve: Callable[[Path], str], prefer: str, chosen: str
) -> None:
    extra = (
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,"
        " TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n"
        f"  prefer_server_cipher_suites: {prefer}\n"
    )
    port = int(serve(write_config(tmp_path, tls_block(pki, extra))).rsplit(":", 1)[1])
    assert handshake(port, pki.ca, tls12_offering(AES128, AES256)) == chosen


def test_curve_preferences_are_honored(
    tmp_path: Path, pki: Pki, serve: Callable[[Path], str]
) -> None:
    url = serve(write_config(tmp_path, tls_block(pki, "  curve_preferences: [CurveP384]\n")))
    port = int(url.rsplit(":", 1)[1])

    def curve(name: str) -> Callable[[ssl.SSLContext], None]:
        return lambda context: context.set_ecdh_curve(name)

    assert handshake(port, pki.ca, curve("secp384r1"))
    for other in ("prime256v1", "X25519"):
        with pytest.raises(ssl.SSLError):
            handshake(port, pki.ca, curve(other))


def test_http_server_config_headers_are_sent(
    tmp_path: Path, pki: Pki, serve: Callable[[Path], str]
) -> None:
    config = write_config(
        tmp_path,
        tls_block(pki)
        + f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n"
        + "http_server_config:\n  http2: false\n  headers:\n"
        + "    Strict-Transport-Security: max-age=31536000; includeSubDomains\n"
        + "    X-Content-Type-Options: nosniff\n",
    )
    url = serve(config)
    http = client()
    http.verify = str(pki.ca)
    for answer in (
        http.get(f"{url}/metrics", auth=(USER, PASSWORD), timeout=5),
        http.get(f"{url}/metrics", timeout=5),  # 401
        http.get(f"{url}/healthz", timeout=5),
        http.get(f"{url}/nope", timeout=5),
    ):
        assert answer.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
        assert answer.headers["X-Content-Type-Options"] == "nosniff"


def test_client_certificate_required(
    tmp_path: Path, pki: Pki, serve: Callable[[Path], str]
) -> None:
    config = write_config(
        tmp_path,
        tls_block(
            pki,
            f"  client_ca_file: {pki.ca}\n  client_auth_type: RequireAndVerifyClientCert\n",
        ),
    )
    url = serve(config)
    http = client()
    http.verify = str(pki.ca)
    with pytest.raises(TLS_ERRORS):
        http.get(f"{url}/metrics", timeout=5)
    with pytest.raises(TLS_ERRORS):
        http.get(f"{url}/metrics", cert=pki.rogue, timeout=5)
    ok = http.get(f"{url}/metrics", cert=pki.client, timeout=5)
    assert ok.status_code == 200 and "wattprint_build_info" in ok.text


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("tls_server_config: [\n", "not valid YAML"),
        ("basic_auth_user:\n  a: b\n", "'basic_auth_user'"),
        ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "nope.crt"),
        ("tls_server_config:\n  cert_file: CERT\n", "needs cert_file and key_file"),
        ("tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n  min_version: TLS9\n", "TLS9"),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n"
            "  client_auth_type: RequireAndVerifyClientCert\n",
            "needs client_ca_file",
        ),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n"
            "  client_auth_type: RequireAnyClientCert\n",
            "needs client_ca_file",
        ),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n  client_auth_type: Always\n",
            "'Always'",
        ),
        ("tls_server_config:\n  cert_file: KEY\n  key_file: KEY\n", "holds no PEM certificate"),
        ("tls_server_config:\n  cert_file: GARBAGE\n  key_file: KEY\n", "holds no PEM certificate"),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: GARBAGE\n",
            "holds no PEM private key",
        ),
        ("tls_server_config:\n  cert_file: BADPEM\n  key_file: KEY\n", "not a valid certificate"),
        ("tls_server_config:\n  cert_file: CERT\n  key_file: OTHERKEY\n", "is not the key of"),
        ("tls_server_config:\n  cert_file: CERT\n  key_file: LOCKEDKEY\n", "is encrypted"),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n"
            "  cipher_suites: [TLS_FAST_AND_LOOSE]\n",
            "unknown cipher suite 'TLS_FAST_AND_LOOSE'",
        ),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n"
            "  curve_preferences: [X25519, CurveP256]\n",
            "give one curve",
        ),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n"
            "  curve_preferences: [CurveP999]\n",
            "curve_preferences",
        ),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n"
            "  prefer_server_cipher_suites: sometimes\n",
            "prefer_server_cipher_suites",
        ),
        ("http_server_config:\n  headers:\n    Set-Cookie: a=b\n", "'Set-Cookie' cannot be set"),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "'allow'"),
        ("http_server_config:\n  http3: true\n", "'http3'"),
        ("basic_auth_users:\n  alice: plain-text-password\n", "not a bcrypt hash"),
        ("basic_auth_users: []\n", "basic_auth_users"),
        (f"basic_auth_users:\n  alice: $2y$20${'a' * 53}\n", "bcrypt cost 20, over 14"),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n  min_version: [TLS12]\n",
            "min_version must be a name",
        ),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n"
            "  curve_preferences: [{X25519: 1}]\n",
            "curve_preferences",
        ),
        ("1: a\nbasic_auth_userz: b\n", "unknown key '1'"),
        (
            "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n"
            "  min_version: TLS13\n  max_version: TLS12\n",
            "max_version TLS12 is below min_version TLS13",
        ),
        ("- just\n- a list\n", "mapping"),
    ],
)
def test_bad_web_config_is_one_line(tmp_path: Path, pki: Pki, content: str, named: str) -> None:
    (tmp_path / "garbage.pem").write_text("garbage\n")
    (tmp_path / "bad.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
    )
    locked = subprocess.run(
        ["openssl", "pkey", "-in", str(pki.server_key), "-aes256", "-passout", "pass:x"],
        capture_output=True,
        check=True,
    )
    (tmp_path / "locked.key").write_bytes(locked.stdout)
    for word, path in [
        ("GARBAGE", tmp_path / "garbage.pem"),
        ("BADPEM", tmp_path / "bad.pem"),
        ("OTHERKEY", pki.rogue[1]),
        ("LOCKEDKEY", tmp_path / "locked.key"),
        ("CERT", pki.server_cert),
        ("KEY", pki.server_key),
    ]:
        content = content.replace(word, str(path))
    path = write_config(tmp_path, content)
    with pytest.raises(WebConfigError) as raised:
        load_web_config(str(path))
    message = str(raised.value)
    assert named in message and str(path) in message
    assert "\n" not in message


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exporter_command(config: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "wattprint",
        f"--web.config.file={config}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--gpu.source=none",
        "--cpu.source=none",
        "--memory.source=none",
        "--carbon.zone=DE",
        "--sample.interval=100ms",
    ]


def clean_env() -> dict[str, str]:
    """No WATTPRINT_* setting of the test run's, but still no state file or node lock:
    an exporter already running on the machine holds /var/lib/wattprint's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATTPRINT_")}
    env["WATTPRINT_STATE_FILE"] = ""
    return env


@pytest.mark.parametrize(
    "content",
    [
        "basic_auth_users:\n  alice: hunter2\n",
        "tls_server_config: {cert_file: x}\n",
        "tls_server_config: {cert_file: garbage.pem, key_file: garbage.pem}\n",
    ],
)
def test_exporter_with_bad_web_config_exits_2(tmp_path: Path, content: str) -> None:
    (tmp_path / "garbage.pem").write_text("garbage\n")
    config = write_config(tmp_path, content)
    started = time.monotonic()
    result = subprocess.run(
        exporter_command(config, free_port()),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=20,
    )
    assert result.returncode == 2, result.stderr
    assert time.monotonic() - started < 10
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(config) in lines[0], result.stderr
    assert "Traceback" not in result.stderr and "_ssl.c" not in result.stderr


def test_exporter_process_protected_end_to_end(tmp_path: Path, pki: Pki) -> None:
    config = write_config(
        tmp_path, tls_block(pki) + f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        exporter_command(config, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    url = f"https://127.0.0.1:{port}"
    http = client()
    http.verify = str(pki.ca)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if http.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "exporter did not start"
            time.sleep(0.1)
        assert http.get(f"{url}/metrics", timeout=5).status_code == 401
        ok = http.get(f"{url}/metrics", auth=(USER, PASSWORD), timeout=5)
        assert ok.status_code == 200 and "wattprint_collector_success" in ok.text
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_clients_stuck_in_the_handshake_do_not_block_a_scrape(
    tmp_path: Path, pki: Pki, serve: Callable[[Path], str]
) -> None:
    url = serve(write_config(tmp_path, tls_block(pki)))
    port = int(url.rsplit(":", 1)[1])
    stuck = []
    try:
        for i in range(100):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:  # the start of a ClientHello record, and then nothing
                sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            stuck.append(sock)
        http = client()
        http.verify = str(pki.ca)
        started = time.monotonic()
        assert http.get(f"{url}/metrics", timeout=5).status_code == 200
        assert time.monotonic() - started < 1.0
    finally:
        for sock in stuck:
            sock.close()


def test_a_client_trickling_its_handshake_is_cut_off(
    tmp_path: Path, pki: Pki, serve: Callable[[Path], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ClientHello trickled a byte at a time must not hold its connection (and
    thread) for hours. CPython applies a socket's timeout to the whole handshake, not
    to each read, so the one set on accept is the handshake's deadline."""
    monkeypatch.setattr(server_module, "CLIENT_TIMEOUT_S", 1.0)
    url = serve(write_config(tmp_path, tls_block(pki)))
    port = int(url.rsplit(":", 1)[1])
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(500)
    closed_after = seconds_until_cut_off(("127.0.0.1", port), hello)
    assert closed_after is not None, "the trickling handshake was never cut off"
    assert 0.8 <= closed_after < 2.5
    http = client()
    http.verify = str(pki.ca)
    assert http.get(f"{url}/metrics", timeout=5).status_code == 200
