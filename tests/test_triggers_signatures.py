"""GitHub signatures and delivery parsing, against the worked examples and real payloads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from django_leases.triggers.errors import MalformedDelivery
from django_leases.triggers.providers import MAX_PAYLOAD_DEPTH, GitHubProvider, decode_json_object
from django_leases.triggers.signatures import github_signature, verify_github_signature


def _manifest(shared_fixtures: Path) -> dict[str, Any]:
    return json.loads((shared_fixtures / "manifest.json").read_text())


def _github_files(shared_fixtures: Path) -> list[dict[str, Any]]:
    events = _manifest(shared_fixtures)["github"]["events"]
    return [entry for event in events.values() for entry in event["files"]]


# -- the signer ------------------------------------------------------------------------------


def test_signer_matches_githubs_documented_vector() -> None:
    # GitHub's "Validating webhook deliveries" example, quoted in the fixtures README.
    assert github_signature("It's a Secret to Everybody", b"Hello, World!") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )


def test_signer_matches_the_readmes_second_vector() -> None:
    body = b'{"zen":"Design for failure.","hook_id":1}'
    assert github_signature("s3cr3t", body) == (
        "sha256=249af1ce99a079bae70d0169c066a8f6dd3f1be979a531df6e8a7b9248a8a896"
    )


def test_signer_matches_every_example_header_in_the_manifest(shared_fixtures: Path) -> None:
    manifest = _manifest(shared_fixtures)
    secret = manifest["signing_examples"]["github_secret"]
    files = _github_files(shared_fixtures)
    assert len(files) >= 20
    for entry in files:
        body = (shared_fixtures / entry["file"]).read_bytes()
        expected = entry["example_headers"]["X-Hub-Signature-256"]
        assert github_signature(secret, body) == expected, entry["file"]
        assert verify_github_signature(secret, body, expected)


def test_signer_refuses_an_empty_secret() -> None:
    with pytest.raises(ValueError, match="secret"):
        github_signature("", b"x")


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "sha256=",
        "sha1=757107ea0eb2509fc211221cce984b8a37570b6d",
        "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e18",
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e1",
        "sha256=ÿÿ",  # latin-1 text from a header: unequal, never a TypeError
    ],
)
def test_verify_refuses_missing_and_wrong_headers(header: str | None) -> None:
    assert not verify_github_signature("It's a Secret to Everybody", b"Hello, World!", header)


def test_verify_refuses_a_tampered_body_and_another_secret() -> None:
    header = github_signature("right", b"body")
    assert verify_github_signature("right", b"body", header)
    assert verify_github_signature("right", b"body", header.upper().replace("SHA256", "sha256"))
    assert not verify_github_signature("right", b"body ", header)
    assert not verify_github_signature("wrong", b"body", header)
    assert not verify_github_signature("", b"body", header)


# -- parsing ---------------------------------------------------------------------------------


def _headers(event: str | None = "push", delivery: str | None = "d-1", **extra: str) -> dict:
    headers = {"content-type": "application/json", **extra}
    if event is not None:
        headers["x-github-event"] = event
    if delivery is not None:
        headers["x-github-delivery"] = delivery
    return headers


def test_parse_reads_every_real_payload(shared_fixtures: Path) -> None:
    provider = GitHubProvider()
    for entry in _github_files(shared_fixtures):
        body = (shared_fixtures / entry["file"]).read_bytes()
        example = {key.lower(): value for key, value in entry["example_headers"].items()}
        parsed = provider.parse(body, example)
        assert parsed.event == entry["example_headers"]["X-GitHub-Event"]
        assert parsed.delivery_id == entry["example_headers"]["X-GitHub-Delivery"]
        assert parsed.payload == json.loads(body)
        assert parsed.payload.get("action") == entry["action"]


def test_parse_reads_githubs_form_content_type(shared_fixtures: Path) -> None:
    from urllib.parse import urlencode

    raw = (shared_fixtures / "github/push/payload.json").read_bytes()
    body = urlencode({"payload": raw.decode()}).encode()
    headers = _headers(**{"content-type": "application/x-www-form-urlencoded"})
    assert GitHubProvider().parse(body, headers).payload == json.loads(raw)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (_headers(event=None), "X-GitHub-Event"),
        (_headers(delivery=None), "X-GitHub-Delivery"),
        (_headers(event="  "), "X-GitHub-Event"),
        (_headers(delivery="x" * 201), "longer"),
        (_headers(event="push\x01"), "control"),
    ],
)
def test_parse_refuses_bad_headers(headers: dict, message: str) -> None:
    with pytest.raises(MalformedDelivery, match=message):
        GitHubProvider().parse(b"{}", headers)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'"text"',
        b"\xff\xfe{}",
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": 1e999}',
        b'{"a": "nul \\u0000 inside"}',
        b'{"nul\\u0000key": 1}',
        b'{"a": "\\ud800"}',
        b'{"a": ' * 5000 + b"1" + b"}" * 5000,
        b'{"a": ' + b"[" * (MAX_PAYLOAD_DEPTH + 1) + b"]" * (MAX_PAYLOAD_DEPTH + 1) + b"}",
    ],
)
def test_parse_refuses_bodies_a_json_column_cannot_hold(body: bytes) -> None:
    with pytest.raises(MalformedDelivery):
        GitHubProvider().parse(body, _headers())


@pytest.mark.parametrize(
    "body",
    [b"payload=1&payload=2", b"other=1", b"payload=%7B", b"payload=%FF"],
)
def test_parse_refuses_bad_forms(body: bytes) -> None:
    headers = _headers(**{"content-type": "application/x-www-form-urlencoded"})
    with pytest.raises(MalformedDelivery):
        GitHubProvider().parse(body, headers)


def test_decode_keeps_unicode_and_big_numbers_exactly() -> None:
    payload = decode_json_object('{"name": "Zoë 🚀", "n": 12345678901234567890, "f": 1.5}')
    assert payload == {"name": "Zoë 🚀", "n": 12345678901234567890, "f": 1.5}
