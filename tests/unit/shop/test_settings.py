"""The shop's settings: a value read from its WEIR_SHOP_* variables, with the defaults it always had."""

from __future__ import annotations

import pytest

from shop.settings import ShopSettings

NAMES = (
    "WEIR_SHOP_CARD_REJECT_RATE",
    "WEIR_SHOP_SEED",
    "WEIR_SHOP_CARD_KEY",
    "WEIR_SHOP_STOCK",
    "WEIR_SHOP_STOCK_OVERRIDES",
    "WEIR_SHOP_DISPATCH_TIMEOUT_MS",
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)


def test_defaults() -> None:
    settings = ShopSettings.from_env()
    assert settings == ShopSettings(card_reject_rate=0.05, seed=42, card_key="", stock=1000, stock_overrides=(), dispatch_timeout_ms=30_000)
    assert settings.opening_stock("vanilla") == 1000


def test_each_variable_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in zip(NAMES, ("0.2", "7", "secret", "50", "pistachio=120, mint = 5,lemon", "900"), strict=True):
        monkeypatch.setenv(name, value)
    settings = ShopSettings.from_env()
    assert (settings.card_reject_rate, settings.seed, settings.card_key, settings.stock) == (0.2, 7, "secret", 50)
    assert settings.dispatch_timeout_ms == 900
    assert [settings.opening_stock(flavour) for flavour in ("pistachio", "mint", "lemon", "vanilla")] == [120, 5, 50, 50]
    assert "secret" not in repr(settings), "the card key is never shown"


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("WEIR_SHOP_SEED", "x", "expected an integer"),
        ("WEIR_SHOP_CARD_REJECT_RATE", "often", "expected a number"),
        ("WEIR_SHOP_STOCK_OVERRIDES", "pistachio=lots", "'lots' is not an integer"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch, name: str, value: str, problem: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"setting {name}=.*{problem}"):
        ShopSettings.from_env()
