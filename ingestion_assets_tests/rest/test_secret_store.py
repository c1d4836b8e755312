"""The file secret store: one secret per file, atomic replacement, private permissions, errors without values."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingestion_assets.sources.rest import FileSecretStore, Secret
from ingestion_assets.sources.rest.secret_store import SecretStoreError


def test_a_secret_is_written_privately_and_read_back_by_reference(tmp_path: Path) -> None:
    store = FileSecretStore(tmp_path / "secrets")
    store.write("refresh_token", "first-value")
    store.ref("refresh_token").write(Secret("second-value"))
    assert store.read("refresh_token").reveal() == "second-value"
    assert store.ref("refresh_token").read().reveal() == "second-value"
    assert (tmp_path / "secrets").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "secrets" / "refresh_token").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (tmp_path / "secrets").iterdir()) == ["refresh_token"]  # no temporary left


def test_a_secret_shows_only_where_it_came_from(tmp_path: Path) -> None:
    store = FileSecretStore(tmp_path)
    store.write("api_key", "value-that-must-not-show")
    secret = store.read("api_key")
    for text in (repr(secret), str(secret), f"{secret}", repr([secret]), repr(store.ref("api_key"))):
        assert "value-that-must-not-show" not in text
    assert str(tmp_path / "api_key") in repr(secret)


def test_missing_empty_and_badly_named_secrets_fail_naming_the_file(tmp_path: Path) -> None:
    store = FileSecretStore(tmp_path)
    with pytest.raises(SecretStoreError, match=f"cannot read secret file {tmp_path / 'absent'}"):
        store.read("absent")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SecretStoreError, match="is empty"):
        store.read("empty")
    with pytest.raises(SecretStoreError, match="secret name"):
        store.ref("../etc/passwd")
