"""The DBP catalog over CURVE through real sockets: refused keys counted, and the names each
key may register (its certificate's ``names``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from bus.dbp.client import CatalogClient, Denied, ServiceRegistration
from bus.dbp.config import CatalogConfig
from bus.dbp.server import CatalogService
from bus.testing import wait_until
from bus.transport.certs import set_metadata
from tests.curve_helpers import Keys
from tests.zre_helpers import free_udp_port


def registration(name: str) -> dict[str, Any]:
    return {
        "name": name, "address": "127.0.0.1", "port": free_udp_port(), "heartbeat": 0.1,
        "function": "test",
    }  # fmt: skip


@pytest.fixture
def catalog(tmp_path: Path, keys: Keys, cleanup: list[Any]) -> CatalogService:
    config = CatalogConfig(
        port=0, beacon_port=0, heartbeat_interval=0.1, data_dir=str(tmp_path / "dbp"),
        curve=keys.settings(),
    )  # fmt: skip
    service = CatalogService(config)
    service.startService()
    cleanup.append(service)
    return service


def registered(catalog: Any, cleanup: list[Any], name: str, curve: Any) -> ServiceRegistration:
    service = ServiceRegistration(catalog.endpoint, registration(name), curve=curve)
    cleanup.append(service)
    service.startService()
    return service


@pytest_twisted.inlineCallbacks
def test_a_key_registers_only_its_names(catalog: Any, keys: Keys, cleanup: list[Any]) -> Any:
    pumps = keys.curve("pumps", names="pump-1,pump-2")
    anything = keys.curve("ops")
    reader_key = keys.curve("reader", names="")
    yield wait_until(lambda: catalog.curve.zap.allowed_keys == 3, what="three keys listed")
    yield registered(catalog, cleanup, "pump-1", pumps).registered
    refused = registered(catalog, cleanup, "valve", pumps)
    with pytest.raises(Denied, match="may not register 'valve'"):
        yield refused.registered
    yield registered(catalog, cleanup, "valve", anything).registered
    assert sorted(catalog.core.entries) == ["pump-1", "valve"]
    assert catalog.core.counts["forbidden-name"] == 1
    reader = CatalogClient(catalog.endpoint, curve=reader_key)
    cleanup.append(reader)
    listing = yield reader.services()
    assert sorted(listing) == ["pump-1", "valve"]


@pytest_twisted.inlineCallbacks
def test_names_are_checked_from_the_moment_a_certificate_names_them(
    catalog: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    ops = keys.curve("ops")  # no names written: any name
    yield wait_until(lambda: catalog.curve.zap.allowed_keys == 1, what="the key listed")
    yield registered(catalog, cleanup, "pump-1", ops).registered
    assert not catalog._rights and not catalog.router.keep_user_ids  # no key read per message
    # The same key's certificate now names its services: checked from the re-read on.
    set_metadata(keys.allowed / "ops.key", {"names": "pump-1"})  # as bus-keys set does
    yield wait_until(lambda: catalog._rights, what="the allow-list re-read")
    assert catalog.router.keep_user_ids
    refused = registered(catalog, cleanup, "valve", ops)
    with pytest.raises(Denied, match="may not register 'valve'"):
        yield refused.registered
    assert sorted(catalog.core.entries) == ["pump-1"]


@pytest_twisted.inlineCallbacks
def test_unknown_keys_and_plain_text_are_refused(
    catalog: Any, keys: Keys, cleanup: list[Any]
) -> Any:
    stranger = CatalogClient(catalog.endpoint, curve=keys.curve("s", allowed=False))
    plain = CatalogClient(catalog.endpoint)
    cleanup += [stranger, plain]
    for client in (stranger, plain):
        client.services().addErrback(lambda _: None)  # never answered: closed at the end
    yield wait_until(
        lambda: (
            catalog.curve.refusals.get("unknown-key", 0) >= 1
            and catalog.curve.refusals.get("handshake", 0) >= 1
        ),
        what="both refused",
    )
    assert catalog.messages == 0
    assert catalog.status()["curve"]["refused"]["unknown-key"] >= 1
