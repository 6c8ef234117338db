from __future__ import annotations

import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.server.settings import Settings


def test_sources_in_order(tmp_path):
    cfg = tmp_path / "r.toml"
    cfg.write_text("[ragplane]\nport = 6000\nworkers = 3\nlog_json = true\n")
    s = Settings.load({"workers": 5}, env={"RAGPLANE_PORT": "7000"}, config_file=cfg)
    assert (s.port, s.workers, s.log_json) == (7000, 5, True)


def test_unknown_and_bad_values_are_clear():
    with pytest.raises(InvalidArgument, match="unknown setting"):
        Settings.load({"prot": 1}, env={})
    with pytest.raises(InvalidArgument, match="not a valid int"):
        Settings.load({"port": "eighty"}, env={})
    with pytest.raises(InvalidArgument, match="embedder"):
        Settings.load({"embedder": "gpt"}, env={})
    with pytest.raises(InvalidArgument, match="raise max_message_bytes"):
        Settings.load({"max_item_text_bytes": 40 << 20}, env={})
    assert Settings.load({"max_item_text_bytes": 40 << 20, "max_message_bytes": 96 << 20},
                         env={}).max_item_text_bytes == 40 << 20


def test_secrets_are_redacted():
    s = Settings.load({"bootstrap_admin_key": "sekrit"}, env={})
    assert s.redacted()["bootstrap_admin_key"] == "***"
    assert "sekrit" not in repr(s.redacted())


def test_every_setting_is_documented():
    assert all(Settings.docs().values())


def test_a_postgresql_store_url_is_shown_without_its_password():
    from ragplane.server.settings import Settings

    shown = Settings.from_mapping({"store": "postgresql://alice:s3cret@db:5432/rag"}).redacted()
    assert shown["store"] == "postgresql://alice:***@db:5432/rag"
    plain = Settings.from_mapping({"store": "postgresql://bob@db/rag"}).redacted()
    assert plain["store"] == "postgresql://bob@db/rag"


def test_an_unknown_store_is_refused_naming_both_kinds():
    import pytest

    from ragplane.core.errors import InvalidArgument
    from ragplane.server.settings import Settings

    with pytest.raises(InvalidArgument, match="sqlite or a PostgreSQL URL"):
        Settings.from_mapping({"store": "mysql://x"})
