"""The Kafka security settings: parsed and checked from the environment, the same options for every client, no password shown."""

from __future__ import annotations

import ssl

import pytest

from weir.app.settings import kafka_client_options, load_settings

SECRET = "pw-never-shown-31"


def test_plaintext_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WEIR_KAFKA_SECURITY_PROTOCOL", "WEIR_KAFKA_SASL_MECHANISM", "WEIR_KAFKA_SASL_USERNAME", "WEIR_KAFKA_SASL_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    assert kafka_client_options() == {"security_protocol": "PLAINTEXT"}


def test_sasl_plaintext_gives_the_user_and_hides_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_KAFKA_SECURITY_PROTOCOL", "sasl_plaintext")
    monkeypatch.setenv("WEIR_KAFKA_SASL_MECHANISM", "scram-sha-512")
    monkeypatch.setenv("WEIR_KAFKA_SASL_USERNAME", "weir")
    monkeypatch.setenv("WEIR_KAFKA_SASL_PASSWORD", SECRET)
    assert kafka_client_options() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "weir",
        "sasl_plain_password": SECRET,
    }
    settings = load_settings()
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings)


def test_sasl_ssl_builds_a_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("WEIR_KAFKA_SASL_USERNAME", "weir")
    monkeypatch.setenv("WEIR_KAFKA_SASL_PASSWORD", SECRET)
    options = kafka_client_options()
    assert options["security_protocol"] == "SASL_SSL"
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert options["ssl_context"].verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WEIR_KAFKA_SECURITY_PROTOCOL": "TLS"}, "expected one of"),
        ({"WEIR_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "WEIR_KAFKA_SASL_MECHANISM": "GSSAPI"}, "WEIR_KAFKA_SASL_MECHANISM"),
        ({"WEIR_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "WEIR_KAFKA_SASL_PASSWORD": SECRET}, "WEIR_KAFKA_SASL_USERNAME"),
        ({"WEIR_KAFKA_SECURITY_PROTOCOL": "SSL", "WEIR_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"}, "no such file"),
    ],
)
def test_bad_security_settings_are_refused_by_name(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str) -> None:
    for name in ("WEIR_KAFKA_SASL_MECHANISM", "WEIR_KAFKA_SASL_USERNAME", "WEIR_KAFKA_SASL_PASSWORD", "WEIR_KAFKA_SSL_CAFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=expected) as refused:
        load_settings()
    assert SECRET not in str(refused.value)
