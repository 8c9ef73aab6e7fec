"""The shop's agent sets: registered by its entry module, each a module of one agent running one actor."""

from __future__ import annotations

import importlib

import pytest

from shop.agents import AGENT_SETS
from weir.app.core import app
from weir.app.settings import agent_module, load_settings, register_agent_sets


def test_the_shops_agent_sets_are_its_own_modules_and_weirs_are_weirs() -> None:
    register_agent_sets(AGENT_SETS)  # what shop.main does before weir's entry module
    assert {name: agent_module(name) for name in AGENT_SETS} == AGENT_SETS
    assert all(module.startswith("shop.agents.") for module in AGENT_SETS.values())
    assert agent_module("splitter") == "weir.agents.splitter"


def test_every_shop_agent_runs_one_actor() -> None:
    for name, module in AGENT_SETS.items():
        importlib.import_module(module)
        agents = [agent for agent in app.agents.values() if agent.name.rsplit(".", 1)[-1] == name]
        assert agents, f"{module} declares no agent named {name}"
        assert all(agent.concurrency == 1 for agent in agents), f"{name} runs several actors: out of order under exactly_once"


def test_a_package_cannot_take_a_name_of_weirs_agents() -> None:
    with pytest.raises(ValueError, match="agent set 'flows'"):
        register_agent_sets({"flows": "mine.flows"})


def test_weir_agents_names_the_shops_sets_once_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    register_agent_sets(AGENT_SETS)
    monkeypatch.setenv("WEIR_APP_ID", "shop-1")
    monkeypatch.setenv("WEIR_AGENTS", "shop_orders,shop_claims")
    settings = load_settings()
    assert settings.agents == ("shop_claims", "shop_orders")
    assert settings.group_id == "shop-1-shop_claims_shop_orders", "the consumer group the shop's orders worker always had"
    monkeypatch.setenv("WEIR_AGENTS", "shop_ordres")
    with pytest.raises(ValueError, match=r"unknown agent\(s\) \['shop_ordres'\]"):
        load_settings()
