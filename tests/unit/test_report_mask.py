"""What report.json and manifest.json mask: secrets, and nothing a user needs to read back."""

from __future__ import annotations

from conveyor.secrets import mask


def test_settings_named_like_keys_are_shown_and_secrets_masked() -> None:
    """sink.primary_key (whether a created target gets the source's primary key) was shown as ***
    in every report.json, as if it were a secret; the secrets beside it stay masked."""
    config = {"sink": {"primary_key": True, "password": "pw1", "options": {"password": "pw2"}, "merge_keys": ["id"]},
              "strategy": {"distribute_key": "o_orderkey"},
              "source": {"storage_options": {"key": "AKIA", "secret": "s3", "access_key": "a", "secret_key": "b",
                                             "private_key": "pk", "token": "t", "password_env": "PGPASSWORD"}}}
    masked = mask(config)
    assert masked["sink"]["primary_key"] is True
    assert mask({"primary_key": False}) == {"primary_key": False}
    assert masked["sink"]["merge_keys"] == ["id"]
    assert masked["strategy"]["distribute_key"] == "o_orderkey"
    assert masked["source"]["storage_options"]["password_env"] == "PGPASSWORD"
    assert masked["sink"]["password"] == masked["sink"]["options"]["password"] == "***"
    assert all(masked["source"]["storage_options"][k] == "***" for k in ("key", "secret", "access_key", "secret_key", "private_key", "token"))
