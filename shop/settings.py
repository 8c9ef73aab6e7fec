"""The shop's settings, a value read from its ``WEIR_SHOP_*`` environment variables where a command starts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from weir import SettingError

__all__ = ["ShopSettings", "demo_web_port"]


def _raw(name: str) -> str | None:
    raw = os.environ.get(name)
    return None if raw is None or raw == "" else raw


def _int(name: str, default: int) -> int:
    raw = _raw(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingError(f"setting {name}={raw!r}: expected an integer") from None


def _float(name: str, default: float) -> float:
    raw = _raw(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingError(f"setting {name}={raw!r}: expected a number") from None


def _stock_overrides(raw: str) -> tuple[tuple[str, int], ...]:
    """``"pistachio=120,mint=50"`` as ((flavour, scoops), ...); an entry without a count is ignored, as it always was."""
    overrides = []
    for entry in raw.split(","):
        name, _, count = entry.partition("=")
        if not name.strip() or not count.strip():
            continue
        try:
            overrides.append((name.strip(), int(count)))
        except ValueError:
            raise SettingError(f"setting WEIR_SHOP_STOCK_OVERRIDES={raw!r}: {count!r} is not an integer") from None
    return tuple(overrides)


def demo_web_port() -> int:
    """``WEIR_DEMO_WEB_PORT`` (default 6066): the web port of a demo's first worker; worker N takes this port + N."""
    port = _int("WEIR_DEMO_WEB_PORT", 6066)
    if not 1 <= port <= 65_000:  # room above it for every worker of a demo
        message = f"setting WEIR_DEMO_WEB_PORT={port}: expected a port from 1 to 65000 (the demos' workers take it and the next ones)"
        raise SettingError(message)
    return port


@dataclass(frozen=True)
class ShopSettings:
    """The shop's configuration. Each field names its environment variable and default."""

    #: WEIR_SHOP_CARD_REJECT_RATE: probability that the payment gateway rejects a card at capture.
    card_reject_rate: float = 0.05
    #: WEIR_SHOP_SEED: seed of the payment gateway's draw (a card's fate is a function of seed, screen, line and order id).
    seed: int = 42
    #: WEIR_SHOP_CARD_KEY: the secret of card tokens (HMAC-SHA256 of the number). The screens draw a random one per
    #: run when it is unset; the orders stage uses it only for a line that reached Kafka without the screens.
    card_key: str = field(default="", repr=False)
    #: WEIR_SHOP_STOCK: scoops of each flavour in stock when the shop opens.
    stock: int = 1000
    #: WEIR_SHOP_STOCK_OVERRIDES: other opening stock for some flavours, e.g. "pistachio=120,mint=50".
    stock_overrides: tuple[tuple[str, int], ...] = ()
    #: WEIR_SHOP_DISPATCH_TIMEOUT_MS: how long dispatch waits for the payment's answer, and then for the kitchen's.
    dispatch_timeout_ms: int = 30_000

    def opening_stock(self, flavour: str) -> int:
        """Scoops of ``flavour`` when the shop opens (``stock`` unless overridden)."""
        for name, count in self.stock_overrides:
            if name == flavour:
                return count
        return self.stock

    @classmethod
    def from_env(cls) -> ShopSettings:
        """Read the settings from the environment (see each field)."""
        defaults = cls()
        return cls(
            card_reject_rate=_float("WEIR_SHOP_CARD_REJECT_RATE", defaults.card_reject_rate),
            seed=_int("WEIR_SHOP_SEED", defaults.seed),
            card_key=_raw("WEIR_SHOP_CARD_KEY") or defaults.card_key,
            stock=_int("WEIR_SHOP_STOCK", defaults.stock),
            stock_overrides=_stock_overrides(_raw("WEIR_SHOP_STOCK_OVERRIDES") or ""),
            dispatch_timeout_ms=_int("WEIR_SHOP_DISPATCH_TIMEOUT_MS", defaults.dispatch_timeout_ms),
        )
