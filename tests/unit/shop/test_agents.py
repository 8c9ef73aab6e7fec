"""The shop's agent sets: handed to its application as objects, each serving one agent that runs one actor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shop.agents import AGENT_MODULES, agent_sets
from shop.settings import ShopSettings
from weir import Application, Settings
from weir.app.runtime import environment
from weir.app.settings import load_settings


@pytest.fixture
def restore_environment() -> Iterator[None]:
    """An application installs the worker's environment for its process: the next tests get the standalone one back."""
    yield
    environment.install(environment.STANDALONE)


@pytest.mark.usefixtures("restore_environment")
@pytest.mark.parametrize("name", sorted(AGENT_MODULES))
def test_each_shop_agent_set_serves_its_stage_as_one_agent_running_one_actor(name: str) -> None:
    application = Application(Settings(agents=(name,), app_id="shop-test"), agent_sets=agent_sets(ShopSettings()))
    app = application.serve_agents()
    assert app is application.app
    agents = list(app.agents.values())
    assert [agent.name for agent in agents] == [name], f"{name} declares other agents than its own: {list(app.agents)}"
    assert all(agent.concurrency == 1 for agent in agents), f"{name} runs several actors: out of order under exactly_once"


@pytest.mark.usefixtures("restore_environment")
def test_an_application_cannot_take_a_name_of_weirs_agents() -> None:
    with pytest.raises(ValueError, match=r"agent sets \['flows'\]: names of weir's own agents"):
        Application(Settings(), agent_sets={"flows": lambda application: []})


@pytest.mark.usefixtures("restore_environment")
def test_a_worker_refuses_an_agent_set_it_does_not_serve() -> None:
    application = Application(Settings(agents=("shop_ordres",)), agent_sets=agent_sets(ShopSettings()))
    with pytest.raises(ValueError, match=r"unknown agent set\(s\) \['shop_ordres'\]"):
        application.serve_agents()


def test_weir_agents_names_the_shops_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_APP_ID", "shop-1")
    monkeypatch.setenv("WEIR_AGENTS", "shop_orders,shop_claims")
    settings = load_settings()
    assert settings.agents == ("shop_claims", "shop_orders")
    assert settings.group_id == "shop-1-shop_claims_shop_orders", "the consumer group the shop's orders worker always had"
    monkeypatch.setenv("WEIR_AGENTS", "shop orders")
    with pytest.raises(ValueError, match=r"setting WEIR_AGENTS='shop orders': expected 'all' or a comma list"):
        load_settings()
