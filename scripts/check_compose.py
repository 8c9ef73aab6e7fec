"""Validate docker/compose.yaml without a Docker engine (or any Docker client).

    python scripts/check_compose.py [docker/compose.yaml]

First the compose specification's own JSON schema (docker/compose-spec.json, the schema Docker Compose validates
with, from compose-spec/compose-go), checked by the ``jsonschema`` package. Then weir's rules, what would
otherwise only fail at ``docker compose up`` or quietly misbehave: every service has an image or a build whose
context and Dockerfile exist, ``depends_on`` names services that exist (with a healthcheck where it waits
for health), a service per agent of ``app.settings.AGENT_NAMES`` running exactly that agent (named after it, or
``<agent>_<n>`` for several), ``WEIR_AGENTS`` naming agents the service's entry module knows (weir's, or those a
package's application serves, e.g. ``shop.main``), ``flows`` only with its ``WEIR_FLOWS`` (``windows`` with its
``WEIR_WINDOWS``), a ``kafka`` service; every worker advertises its own address (``--web-host`` its service name,
``--web-port`` a port no other service takes, equal to its ``WEIR_WEB_PORT``, published as the same port on
127.0.0.1, its ``hostname`` the service name, no replicas); published ports bound to the loopback address only,
named volumes declared, relative bind mounts (``./prometheus.yml``) naming files or folders that exist. Prints
``compose ok: N services`` or one line per problem, and exits 1 on problems.
"""

from __future__ import annotations

import importlib
import ipaddress
import itertools
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

try:
    import yaml
except ImportError:  # pragma: no cover - reported by main()
    yaml = None
try:
    import jsonschema
except ImportError:  # pragma: no cover - reported by check_config()
    jsonschema = None

__all__ = ["check_compose", "check_config", "main"]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_COMPOSE = ROOT / "docker" / "compose.yaml"
#: The compose specification's JSON schema, as compose-spec/compose-go v2.17.0 ships it (schema/compose-spec.json).
COMPOSE_SCHEMA = ROOT / "docker" / "compose-spec.json"
BROKER_SERVICE = "kafka"
_DEPENDS_CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")


#: Entry modules of packages built on weir that the compose file runs (``faust -A <entry> worker``), and where each
#: lists the agent sets its application serves (``module:NAME``, a mapping of set name -> module).
ENTRY_AGENT_SETS = {"shop.main": "shop.agents:AGENT_MODULES"}


def _on_path() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def _agent_names() -> tuple[str, ...]:
    _on_path()
    from weir.app.settings import AGENT_NAMES, OPTIONAL_AGENT_NAMES

    # "flows" and "windows" run the user's WEIR_FLOWS / WEIR_WINDOWS modules: a service for them belongs to the user's
    # own deployment.
    return AGENT_NAMES + tuple(name for name in OPTIONAL_AGENT_NAMES if name not in ("flows", "windows"))


def _entry(service: Mapping[str, Any]) -> str:
    """The worker entry module a service runs: the ``-A`` of its command, else the image's (``app.main``)."""
    words = _command_words(service)
    return _option(words, "-A") or _option(words, "--app") or "app.main"


def _entry_agent_sets(entry: str) -> tuple[str, ...] | None:
    """The agent sets ``entry`` registers; None for an entry this checker does not know."""
    if entry == "app.main":
        return ()
    spec = ENTRY_AGENT_SETS.get(entry)
    if spec is None:
        return None
    _on_path()
    module, _, name = spec.partition(":")
    return tuple(getattr(importlib.import_module(module), name))


def check_compose(path: Path | str, *, base_dir: Path | str | None = None, agent_names: Iterable[str] | None = None) -> list[str]:
    """The problems of the compose file at ``path`` (empty when it is fine).

    Relative build paths resolve against ``base_dir`` (default: the compose file's folder, as Compose does).
    """
    if yaml is None:
        raise RuntimeError("check_compose needs PyYAML: pip install pyyaml")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        return [f"{path}: cannot read: {error}"]
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return [f"{path}: not valid YAML: {error}"]
    return check_config(config, base_dir=Path(base_dir) if base_dir is not None else path.parent, agent_names=agent_names)


def check_config(config: Any, *, base_dir: Path, agent_names: Iterable[str] | None = None) -> list[str]:
    """The problems of an already parsed compose document."""
    if not isinstance(config, Mapping):
        return ["the file is not a mapping with a 'services' key"]
    services = config.get("services")
    if not isinstance(services, Mapping) or not services:
        return ["no 'services' mapping"]
    declared_volumes = config.get("volumes") or {}
    if not isinstance(declared_volumes, Mapping):
        return ["top-level 'volumes' is not a mapping"]
    agents = tuple(agent_names) if agent_names is not None else _agent_names()

    errors: list[str] = _check_schema(config)
    for name, service in services.items():
        if not isinstance(service, Mapping):
            errors.append(f"service {name}: not a mapping")
            continue
        errors += [f"service {name}: {problem}" for problem in _check_service(service, services, declared_volumes, base_dir)]
        errors += [f"service {name}: {problem}" for problem in _check_weir_env(service, agents)]
    errors += _check_addresses(services)

    if BROKER_SERVICE not in services:
        errors.append(f"no '{BROKER_SERVICE}' service (the broker the workers' KAFKA_BOOTSTRAP points to)")
    for agent in agents:
        named = [name for name in services if name == agent or _is_numbered(str(name), agent)]
        if not named:
            errors.append(
                f"no service for agent '{agent}' (expected a service named '{agent}', or '{agent}_1'..., with WEIR_AGENTS={agent})"
            )
        for name in named:
            service = services[name]
            value = _environment(service).get("WEIR_AGENTS") if isinstance(service, Mapping) else None
            if value != agent:
                errors.append(f"service {name}: WEIR_AGENTS is {value!r}, expected {agent!r}")
    return errors


def _is_numbered(name: str, agent: str) -> bool:
    """``<agent>_<n>``: one of several services of one agent."""
    prefix, _, number = name.rpartition("_")
    return prefix == agent and number.isdigit()


def _check_schema(config: Mapping[str, Any]) -> list[str]:
    """The compose specification's schema, by a maintained JSON Schema validator (what ``docker compose config``
    checks first)."""
    if jsonschema is None:
        return ["cannot check the compose specification's schema: pip install jsonschema"]
    import json

    schema = json.loads(COMPOSE_SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for error in sorted(validator.iter_errors(config), key=lambda error: list(map(str, error.absolute_path))):
        where = "/".join(str(part) for part in error.absolute_path) or "(top)"
        problems.append(f"schema: {where}: {error.message}")
    return problems


def _command_words(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command")
    return command.split() if isinstance(command, str) else [str(word) for word in command] if isinstance(command, list) else []


def _option(words: list[str], flag: str) -> str | None:
    for option, value in itertools.pairwise(words):
        if option == flag:
            return value
    return None


def _check_addresses(services: Mapping[str, Any]) -> list[str]:
    """Every worker advertises an address of its own: the table views send a key's request to the worker whose
    advertised address owns it, and a worker's transactional id and static membership are ``<host>-<port>``."""
    errors: list[str] = []
    owners: dict[str, str] = {}
    for name, service in services.items():
        if not isinstance(service, Mapping) or "WEIR_AGENTS" not in _environment(service):
            continue
        words = _command_words(service)
        host, port = _option(words, "--web-host"), _option(words, "--web-port")
        if host != name:
            errors.append(f"service {name}: advertises --web-host {host!r}: give it its service name ({name!r}), reachable by the others")
        if port is None or not port.isdigit():
            errors.append(f"service {name}: no --web-port of its own in its command")
            continue
        if port in owners:
            errors.append(f"service {name}: web port {port} is service {owners[port]}'s too")
        owners[port] = str(name)
        env_port = _environment(service).get("WEIR_WEB_PORT")
        if env_port is not None and env_port != port:
            errors.append(f"service {name}: WEIR_WEB_PORT={env_port} but --web-port {port}")
        if f"127.0.0.1:{port}:{port}" not in [str(entry) for entry in service.get("ports") or []]:
            errors.append(f"service {name}: web port {port} not published as '127.0.0.1:{port}:{port}'")
        if service.get("hostname") != name:
            errors.append(
                f"service {name}: hostname {service.get('hostname')!r}: set it to {name!r} (its transactional id is <host>-<port>)"
            )
        if _replicas(service) > 1:
            errors.append(f"service {name}: {_replicas(service)} replicas would advertise one address: one service per worker")
    return errors


def _check_service(
    service: Mapping[str, Any], services: Mapping[str, Any], declared_volumes: Mapping[str, Any], base_dir: Path
) -> list[str]:
    errors: list[str] = []
    if "image" not in service and "build" not in service:
        errors.append("has neither 'image' nor 'build'")
    if "build" in service:
        errors += _check_build(service["build"], base_dir)
    errors += _check_depends_on(service.get("depends_on"), services)
    errors += _check_ports(service.get("ports"), _replicas(service))
    errors += _check_volumes(service.get("volumes"), declared_volumes, base_dir)
    if _replicas(service) > 1 and "container_name" in service:
        errors.append("sets container_name and deploy.replicas > 1 (container names must be unique)")
    return errors


def _check_build(build: Any, base_dir: Path) -> list[str]:
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, Mapping):
        return ["'build' is neither a path nor a mapping"]
    context_value = str(build.get("context", "."))
    if "://" in context_value or context_value.startswith("git@"):
        return []  # a remote context: nothing to find on disk
    context = (base_dir / context_value).resolve()
    if not context.is_dir():
        return [f"build context {context_value!r} is not a folder ({context})"]
    if "dockerfile_inline" in build:
        return []
    dockerfile_value = str(build.get("dockerfile", "Dockerfile"))
    dockerfile = (context / dockerfile_value).resolve()
    if not dockerfile.is_file():
        return [f"dockerfile {dockerfile_value!r} not found in build context {context_value!r} ({dockerfile})"]
    return []


def _check_depends_on(depends_on: Any, services: Mapping[str, Any]) -> list[str]:
    if depends_on is None:
        return []
    if isinstance(depends_on, list):
        wanted: dict[Any, Any] = {name: {} for name in depends_on}
    elif isinstance(depends_on, Mapping):
        wanted = dict(depends_on)
    else:
        return ["'depends_on' is neither a list nor a mapping"]
    errors: list[str] = []
    for target, spec in wanted.items():
        if target not in services:
            errors.append(f"depends_on names unknown service {target!r}")
            continue
        condition = spec.get("condition", "service_started") if isinstance(spec, Mapping) else "service_started"
        if condition not in _DEPENDS_CONDITIONS:
            errors.append(f"depends_on {target}: unknown condition {condition!r}")
        elif condition == "service_healthy":
            healthcheck = services[target].get("healthcheck") if isinstance(services[target], Mapping) else None
            if not isinstance(healthcheck, Mapping) or healthcheck.get("disable") or "test" not in healthcheck:
                errors.append(f"depends_on {target} with service_healthy, but {target} has no healthcheck")
    return errors


def _replicas(service: Mapping[str, Any]) -> int:
    deploy = service.get("deploy")
    replicas = deploy.get("replicas", 1) if isinstance(deploy, Mapping) else service.get("scale", 1)
    try:
        return int(replicas)
    except (TypeError, ValueError):
        return 1


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _parse_port(entry: Any) -> tuple[str, str] | None:
    """(host ip, host port) of a published port; '' for what the entry leaves out. None if unparsable."""
    if isinstance(entry, int):
        return "", ""
    if isinstance(entry, Mapping):
        return str(entry.get("host_ip", "")), str(entry.get("published", ""))
    if not isinstance(entry, str):
        return None
    spec = entry.split("/", 1)[0]
    if spec.startswith("["):  # [::1]:6066:6066
        host, _, rest = spec[1:].partition("]")
        parts = rest.lstrip(":").split(":")
        return host, parts[0] if len(parts) == 2 else ""
    parts = spec.split(":")
    if len(parts) == 1:
        return "", ""
    if len(parts) == 2:
        return "", parts[0]
    if len(parts) == 3:
        return parts[0], parts[1]
    return None


def _check_ports(ports: Any, replicas: int) -> list[str]:
    if ports is None:
        return []
    if not isinstance(ports, list):
        return ["'ports' is not a list"]
    errors: list[str] = []
    for entry in ports:
        parsed = _parse_port(entry)
        if parsed is None:
            errors.append(f"cannot parse port {entry!r}")
            continue
        host_ip, host_port = parsed
        if not host_ip or not _is_loopback(host_ip):
            bound = host_ip or "every interface"
            errors.append(f"port {entry!r} is published on {bound}: bind it to 127.0.0.1 (e.g. '127.0.0.1:6066:6066')")
        if replicas > 1 and host_port and "-" not in host_port:
            errors.append(f"port {entry!r} publishes fixed host port {host_port} with {replicas} replicas")
    return errors


def _check_volumes(volumes: Any, declared: Mapping[str, Any], base_dir: Path) -> list[str]:
    if volumes is None:
        return []
    if not isinstance(volumes, list):
        return ["'volumes' is not a list"]
    errors: list[str] = []
    for entry in volumes:
        if isinstance(entry, Mapping):
            kind = entry.get("type", "volume")
            source = str(entry["source"]) if kind in ("volume", "bind") and entry.get("source") else None
            bind = kind == "bind"
        elif isinstance(entry, str):
            parts = entry.split(":")
            source = parts[0] if len(parts) > 1 else None  # "/path" alone is an anonymous volume
            bind = source is not None and source.startswith((".", "/", "~", "$"))
        else:
            errors.append(f"cannot parse volume {entry!r}")
            continue
        if bind and source and not source.startswith(("/", "~", "$")):
            # A bind mount relative to the compose file (Compose resolves it there): a missing file would be
            # created as an empty folder by the engine, and the service would start without its configuration.
            if not (base_dir / source).exists():
                errors.append(f"bind mount {entry!r}: {source!r} not found ({(base_dir / source).resolve()})")
            continue
        if not source or bind:
            continue  # anonymous volume or an absolute bind mount
        if source not in declared:
            errors.append(f"named volume {source!r} is not declared under the top-level 'volumes'")
    return errors


def _environment(service: Mapping[str, Any]) -> dict[str, str | None]:
    env = service.get("environment")
    if isinstance(env, Mapping):
        return {str(key): None if value is None else str(value) for key, value in env.items()}
    if isinstance(env, list):
        result: dict[str, str | None] = {}
        for item in env:
            key, sep, value = str(item).partition("=")
            result[key] = value if sep else None
        return result
    return {}


def _check_weir_env(service: Mapping[str, Any], agents: tuple[str, ...]) -> list[str]:
    env = _environment(service)
    if "WEIR_AGENTS" not in env:
        return []
    errors: list[str] = []
    entry = _entry(service)
    registered = _entry_agent_sets(entry)
    if registered is None:
        errors.append(f"runs entry module {entry!r}, which registers agent sets this checker does not know (ENTRY_AGENT_SETS)")
        registered = ()
    known = agents + registered + (("flows",) if env.get("WEIR_FLOWS") else ()) + (("windows",) if env.get("WEIR_WINDOWS") else ())
    raw = env["WEIR_AGENTS"] or ""
    chosen = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if raw != "all" and (unknown or not chosen):
        errors.append(f"WEIR_AGENTS={raw!r} names unknown agent(s) {unknown}; expected 'all' or some of {list(known)}")
    bootstrap = env.get("KAFKA_BOOTSTRAP") or ""
    host = bootstrap.rpartition(":")[0]
    if not bootstrap:
        errors.append("runs agents but sets no KAFKA_BOOTSTRAP (the default 127.0.0.1:19092 is the container itself)")
    elif _is_loopback(host):
        errors.append(f"KAFKA_BOOTSTRAP={bootstrap!r} points at the container itself, not the broker service")
    return errors


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0] in ("-h", "--help")):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if yaml is None:
        print("check_compose: PyYAML is required (pip install pyyaml)", file=sys.stderr)
        return 2
    path = Path(args[0]) if args else DEFAULT_COMPOSE
    errors = check_compose(path)
    if errors:
        for error in errors:
            print(f"compose: {error}", file=sys.stderr)
        print(f"compose: {len(errors)} problem(s) in {path}", file=sys.stderr)
        return 1
    services = yaml.safe_load(path.read_text(encoding="utf-8"))["services"]
    print(f"compose ok: {len(services)} services")
    return 0


if __name__ == "__main__":
    sys.exit(main())
