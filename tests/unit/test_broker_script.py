"""scripts/broker.sh says what to install when Java or Maven is missing, before doing anything else (and as root on a
Debian-like system installs them with apt-get), and writes the broker's config (and with WEIR_KAFKA_TLS=1 its TLS
material) as it should (checked with stand-ins for java, mvn, apt-get and id)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "broker.sh"
TOOLS = ("bash", "mkdir", "dirname", "cat", "sed", "head", "kill", "sleep", "rm", "touch", "tail", "seq", "grep", "id")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(
    tmp_path: Path, command: str, provided: tuple[str, ...], extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the script with a PATH holding only basic tools plus ``provided``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in (*TOOLS, *provided):
        if (bin_dir / tool).exists():
            continue
        found = shutil.which(tool)
        if found is None:
            pytest.fail(f"{tool} is needed to run this test")
        (bin_dir / tool).symlink_to(found)
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "WEIR_STATE_DIR": str(tmp_path / "state"),
        "WEIR_KAFKA_PORT": str(_free_port()),
        "WEIR_KAFKA_CONTROLLER_PORT": str(_free_port()),
        **(extra_env or {}),
    }
    env.pop("KAFKA_BOOTSTRAP", None)
    return subprocess.run([str(bin_dir / "bash"), str(SCRIPT), command], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_missing_java_names_what_to_install(tmp_path: Path) -> None:
    result = _run(tmp_path, "start", provided=("mvn",))
    assert result.returncode != 0
    assert "Java 17 or newer is required" in result.stderr
    assert "openjdk-17" in result.stderr
    assert "KAFKA_BOOTSTRAP" in result.stderr


def test_missing_maven_names_what_to_install(tmp_path: Path) -> None:
    result = _run(tmp_path, "jars", provided=("java",))
    assert result.returncode != 0
    assert "Maven (mvn) is required" in result.stderr
    assert "apt-get install maven" in result.stderr


def test_external_broker_is_used_as_is(tmp_path: Path) -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP": "127.0.0.1:1", "WEIR_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0
    assert "using that broker" in result.stdout
    assert not (tmp_path / "state" / "kafka-data").exists()


# ----- the generated config, with a stand-in for java: no broker runs, the script stops after writing it -----

#: Answers `java -version` like Java 17, lets the KRaft format step pass, and exits at once as "Kafka".
FAKE_JAVA = """#!/bin/sh
case "$*" in
  -version) echo 'openjdk version "17.0.15" 2025-04-15' >&2 ;;
  *random-uuid*) echo q1Sh-9_ISia_zwGINzRvyQ ;;
  *StorageTool*) exit 0 ;;
  *) exit 3 ;;
esac
"""
#: What the start needs besides TOOLS once java is there (openssl only for WEIR_KAFKA_TLS=1).
START_TOOLS = ("nohup", "chmod", "mv")
SASL_PASSWORD = "pw-Unit-7d1f3a"


def _start_with_fake_java(tmp_path: Path, with_openssl: bool = True, **extra_env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    java = bin_dir / "java"
    java.write_text(FAKE_JAVA)
    java.chmod(0o755)
    libs = tmp_path / "libs"
    libs.mkdir(exist_ok=True)
    (libs / ".complete").touch()  # newer than broker/pom.xml: no mvn run
    provided = (*START_TOOLS, *(("openssl",) if with_openssl else ()))
    return _run(tmp_path, "start", provided, {"WEIR_KAFKA_LIBS": str(libs), "WEIR_KAFKA_READY_TIMEOUT": "5", **extra_env})


def _config(tmp_path: Path) -> str:
    return (tmp_path / "state" / "kafka" / "server.properties").read_text()


def _openssl(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("openssl")
    if found is None:
        pytest.fail("openssl is needed to run this test")
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(("sasl", "protocol"), [("0", "PLAINTEXT"), ("1", "SASL_PLAINTEXT")])
def test_without_tls_the_listeners_are_as_before_and_no_tls_files_are_made(tmp_path: Path, sasl: str, protocol: str) -> None:
    port, controller = _free_port(), _free_port()
    result = _start_with_fake_java(
        tmp_path,
        with_openssl=False,
        WEIR_KAFKA_PORT=str(port),
        WEIR_KAFKA_CONTROLLER_PORT=str(controller),
        WEIR_KAFKA_SASL=sasl,
        WEIR_KAFKA_SASL_PASSWORD=SASL_PASSWORD,
    )
    config = _config(tmp_path)
    lines = config.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("listeners="))
    expected = [
        f"listeners={protocol}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners={protocol}://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        f"inter.broker.listener.name={protocol}",
        f"listener.security.protocol.map={protocol}:{protocol},CONTROLLER:PLAINTEXT",
    ]
    if sasl == "1":
        expected += [
            "sasl.enabled.mechanisms=PLAIN",
            "sasl.mechanism.inter.broker.protocol=PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required"
            f' username="weir" password="{SASL_PASSWORD}" user_weir="{SASL_PASSWORD}";',
        ]
    assert lines[start : start + len(expected)] == expected
    assert lines[start + len(expected)].startswith("log.dirs="), "nothing more in the listener block"
    assert "ssl." not in config
    assert not (tmp_path / "state" / "kafka" / "tls").exists()
    assert "TLS" not in result.stdout


@pytest.mark.parametrize(("sasl", "protocol"), [("0", "SSL"), ("1", "SASL_SSL")])
def test_tls_config_has_an_ssl_listener_and_owner_only_secrets(tmp_path: Path, sasl: str, protocol: str) -> None:
    port, controller = _free_port(), _free_port()
    _start_with_fake_java(
        tmp_path,
        WEIR_KAFKA_PORT=str(port),
        WEIR_KAFKA_CONTROLLER_PORT=str(controller),
        WEIR_KAFKA_TLS="1",
        WEIR_KAFKA_SASL=sasl,
        WEIR_KAFKA_SASL_PASSWORD=SASL_PASSWORD,
    )
    state = tmp_path / "state"
    tls = state / "kafka" / "tls"
    config = _config(tmp_path)
    password = (tls / "keystore.password").read_text().strip()
    assert len(password) >= 32
    lines = set(config.splitlines())
    for line in (
        f"listeners={protocol}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners={protocol}://127.0.0.1:{port}",
        f"inter.broker.listener.name={protocol}",
        f"listener.security.protocol.map={protocol}:{protocol},CONTROLLER:PLAINTEXT",
        "ssl.keystore.type=PKCS12",
        f"ssl.keystore.location={tls / 'broker.p12'}",
        f"ssl.keystore.password={password}",
        f"ssl.truststore.location={tls / 'ca.pem'}",
        "ssl.endpoint.identification.algorithm=https",
    ):
        assert line in lines, line
    assert ("listener.name.sasl_ssl.plain.sasl.jaas.config" in config) == (sasl == "1")
    # owner-only: the tls dir, the keystore, its password, the config that repeats it
    assert stat.S_IMODE(tls.stat().st_mode) == 0o700
    for path in (tls / "broker.p12", tls / "keystore.password", state / "kafka" / "server.properties"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # no secret in anything others may read, no private key left in the clear
    for path in state.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "PRIVATE KEY" not in text, path
            if path.stat().st_mode & 0o044:
                assert password not in text, path
                assert SASL_PASSWORD not in text, path
    assert sorted(path.name for path in tls.iterdir()) == ["broker.p12", "broker.pem", "ca.pem", "keystore.password"]
    # the certificate: signed by ca.pem, for 127.0.0.1 and localhost; the keystore opens with its password only
    verified = _openssl(
        "verify", "-CAfile", str(tls / "ca.pem"), "-verify_ip", "127.0.0.1", "-verify_hostname", "localhost", str(tls / "broker.pem")
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    san = _openssl("x509", "-in", str(tls / "broker.pem"), "-noout", "-ext", "subjectAltName")
    assert "IP Address:127.0.0.1" in san.stdout
    assert "DNS:localhost" in san.stdout
    opened = _openssl("pkcs12", "-in", str(tls / "broker.p12"), "-passin", f"file:{tls / 'keystore.password'}", "-nokeys", "-clcerts")
    assert opened.returncode == 0, opened.stderr
    assert (tls / "broker.pem").read_text().strip() in opened.stdout
    wrong = tls / "wrong.password"
    wrong.write_text("not-the-password\n")
    assert _openssl("pkcs12", "-in", str(tls / "broker.p12"), "-passin", f"file:{wrong}", "-nokeys").returncode != 0


def test_tls_material_is_made_once_per_state_dir(tmp_path: Path) -> None:
    _start_with_fake_java(tmp_path, WEIR_KAFKA_TLS="1")
    tls = tmp_path / "state" / "kafka" / "tls"
    first = {path.name: path.read_bytes() for path in tls.iterdir()}
    _start_with_fake_java(tmp_path, WEIR_KAFKA_TLS="1")
    assert {path.name: path.read_bytes() for path in tls.iterdir()} == first
    (tls / "broker.p12").unlink()  # incomplete: all made again, with a new CA
    _start_with_fake_java(tmp_path, WEIR_KAFKA_TLS="1")
    assert (tls / "broker.p12").exists()
    assert (tls / "ca.pem").read_bytes() != first["ca.pem"]


def test_tls_without_openssl_names_what_to_install(tmp_path: Path) -> None:
    result = _start_with_fake_java(tmp_path, with_openssl=False, WEIR_KAFKA_TLS="1")
    assert result.returncode != 0
    assert "openssl is required" in result.stderr
    assert not (tmp_path / "state" / "kafka" / "server.properties").exists()


@pytest.mark.parametrize("first_with_tls", [True, False])
def test_start_of_a_running_broker_says_where_ca_pem_is_or_that_it_runs_without_tls(tmp_path: Path, first_with_tls: bool) -> None:
    port, controller = _free_port(), _free_port()
    ports = {"WEIR_KAFKA_PORT": str(port), "WEIR_KAFKA_CONTROLLER_PORT": str(controller)}
    _start_with_fake_java(tmp_path, **ports, WEIR_KAFKA_TLS="1" if first_with_tls else "0")
    ca_file = tmp_path / "state" / "kafka" / "tls" / "ca.pem"
    # "running": this process's pid in the pid file, something listening on the port
    (tmp_path / "state" / "kafka.pid").write_text(f"{os.getpid()}\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        result = _start_with_fake_java(tmp_path, **ports, WEIR_KAFKA_TLS="1")
    assert result.returncode == 0, result.stderr
    assert "already running" in result.stdout
    if first_with_tls:
        assert f"WEIR_KAFKA_SSL_CAFILE={ca_file}" in result.stdout
        assert "TLS (SSL)" in result.stdout
    else:
        assert "started without TLS" in result.stderr
        assert "ca.pem" not in result.stdout


# ----- missing prerequisites installed with apt-get as root on a Debian-like system -----

#: Records its arguments; ``install`` puts a stand-in for what it installs into the script's PATH (unless told to fail).
FAKE_APT_GET = """#!/bin/sh
echo "$*" >>"$APT_RECORD"
[ "$APT_FAIL" = "1" ] && { echo "E: Unable to locate package" >&2; exit 100; }
case "$*" in
  *install*jre-headless*) cp "$APT_STANDINS/java" "$APT_BIN/java" ;;
  *install*maven*) cp "$APT_STANDINS/mvn" "$APT_BIN/mvn" ;;
esac
"""
#: Knows the packages listed in $APT_KNOWN only.
FAKE_APT_CACHE = """#!/bin/sh
for known in $APT_KNOWN; do [ "$2" = "$known" ] && { echo "Package: $known"; exit 0; }; done
exit 100
"""
#: Copies nothing: the script only needs mvn to succeed before it marks the jars complete.
FAKE_MVN = "#!/bin/sh\nexit 0\n"


def _install_env(
    tmp_path: Path, uid: int, with_apt: bool = True, known: str = "openjdk-17-jre-headless openjdk-21-jre-headless"
) -> dict[str, str]:
    """A bin dir with a stand-in ``id`` answering ``uid`` and, with ``with_apt``, stand-ins for apt-get and apt-cache."""
    bin_dir = tmp_path / "bin"
    standins = tmp_path / "standins"
    bin_dir.mkdir(exist_ok=True)
    standins.mkdir(exist_ok=True)
    scripts = {bin_dir / "id": f"#!/bin/sh\necho {uid}\n", standins / "java": FAKE_JAVA, standins / "mvn": FAKE_MVN}
    if with_apt:
        scripts |= {bin_dir / "apt-get": FAKE_APT_GET, bin_dir / "apt-cache": FAKE_APT_CACHE}
    for path, text in scripts.items():
        path.write_text(text)
        path.chmod(0o755)
    return {"APT_RECORD": str(tmp_path / "apt.calls"), "APT_BIN": str(bin_dir), "APT_STANDINS": str(standins), "APT_KNOWN": known}


def _apt_calls(tmp_path: Path) -> list[str]:
    record = tmp_path / "apt.calls"
    return record.read_text().splitlines() if record.exists() else []


@pytest.mark.parametrize(
    ("known", "package"), [("openjdk-17-jre-headless", "openjdk-17-jre-headless"), ("openjdk-21-jre-headless", "openjdk-21-jre-headless")]
)
def test_as_root_with_apt_get_missing_java_is_installed_and_the_start_goes_on(tmp_path: Path, known: str, package: str) -> None:
    env = _install_env(tmp_path, uid=0, known=known)
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / ".complete").touch()
    result = _run(tmp_path, "start", ("cp", *START_TOOLS), {**env, "WEIR_KAFKA_LIBS": str(libs), "WEIR_KAFKA_READY_TIMEOUT": "5"})
    assert _apt_calls(tmp_path) == ["update -qq", f"install -y -qq --no-install-recommends {package}"]
    said = [line for line in result.stdout.splitlines() if "apt-get" in line]
    assert said == [f"broker: Java 17 or newer is missing: installing {package} from the distribution's packages (apt-get, as root)"]
    assert "Java 17 or newer is required" not in result.stderr
    assert (tmp_path / "state" / "kafka" / "server.properties").exists(), "the start went on with the installed java"


def test_as_root_with_apt_get_missing_maven_is_installed_and_the_jars_fetched(tmp_path: Path) -> None:
    env = _install_env(tmp_path, uid=0)
    (tmp_path / "bin" / "java").write_text(FAKE_JAVA)
    (tmp_path / "bin" / "java").chmod(0o755)
    result = _run(tmp_path, "jars", ("cp",), env)
    assert result.returncode == 0, result.stderr
    assert _apt_calls(tmp_path) == ["update -qq", "install -y -qq --no-install-recommends maven"]
    assert "broker: Maven (mvn) is missing: installing maven from the distribution's packages (apt-get, as root)" in result.stdout
    assert (tmp_path / "state" / "kafka" / "libs" / ".complete").exists()


@pytest.mark.parametrize(("uid", "with_apt"), [(1000, True), (0, False)], ids=["not-root", "no-apt-get"])
def test_without_root_or_apt_get_missing_java_stops_with_the_line_of_today(tmp_path: Path, uid: int, with_apt: bool) -> None:
    result = _run(tmp_path, "start", ("cp", "mvn"), _install_env(tmp_path, uid=uid, with_apt=with_apt))
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        "broker: Java 17 or newer is required to run Kafka: install it (Debian: apt-get install openjdk-17-jre-headless)"
        " or set KAFKA_BOOTSTRAP=host:port to use an existing broker."
    ]
    assert _apt_calls(tmp_path) == []
    assert "installing" not in result.stdout


@pytest.mark.parametrize(("uid", "with_apt"), [(1000, True), (0, False)], ids=["not-root", "no-apt-get"])
def test_without_root_or_apt_get_missing_maven_stops_with_the_line_of_today(tmp_path: Path, uid: int, with_apt: bool) -> None:
    env = _install_env(tmp_path, uid=uid, with_apt=with_apt)
    (tmp_path / "bin" / "java").write_text(FAKE_JAVA)
    (tmp_path / "bin" / "java").chmod(0o755)
    result = _run(tmp_path, "jars", ("cp",), env)
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        "broker: Maven (mvn) is required to fetch Kafka's jars: install it (Debian: apt-get install maven)"
        " or set KAFKA_BOOTSTRAP=host:port to use an existing broker."
    ]
    assert _apt_calls(tmp_path) == []
    assert "installing" not in result.stdout


def test_a_failing_apt_get_stops_with_its_log(tmp_path: Path) -> None:
    env = _install_env(tmp_path, uid=0)
    result = _run(tmp_path, "start", ("cp", "mvn"), {**env, "APT_FAIL": "1"})
    assert result.returncode != 0
    assert "E: Unable to locate package" in result.stderr
    assert "apt-get could not install openjdk-17-jre-headless" in result.stderr
    assert _apt_calls(tmp_path) == ["update -qq"]


def test_a_three_node_cluster_writes_one_config_per_node_with_one_static_quorum(tmp_path: Path) -> None:
    ports = [_free_port() for _ in range(3)]
    controllers = [_free_port() for _ in range(3)]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cut").symlink_to(shutil.which("cut") or "/usr/bin/cut")
    result = _start_with_fake_java(
        tmp_path,
        with_openssl=False,
        WEIR_KAFKA_NODES="3",
        WEIR_KAFKA_PORTS=",".join(map(str, ports)),
        WEIR_KAFKA_CONTROLLER_PORTS=",".join(map(str, controllers)),
    )
    assert result.returncode != 0, "the stand-in java exits at once: no node starts"
    voters = ",".join(f"{node}@127.0.0.1:{controllers[node - 1]}" for node in (1, 2, 3))
    for node in (1, 2, 3):
        lines = (tmp_path / "state" / f"kafka-{node}" / "server.properties").read_text().splitlines()
        assert f"node.id={node}" in lines
        assert f"controller.quorum.voters={voters}" in lines
        assert not any(line.startswith("controller.quorum.bootstrap.servers=") for line in lines)
        assert f"listeners=PLAINTEXT://127.0.0.1:{ports[node - 1]},CONTROLLER://127.0.0.1:{controllers[node - 1]}" in lines
        assert f"log.dirs={tmp_path / 'state' / f'kafka-{node}' / 'data'}" in lines
        for setting in ("default.replication.factor", "offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
            assert f"{setting}=3" in lines
        for setting in ("min.insync.replicas", "transaction.state.log.min.isr"):
            assert f"{setting}=2" in lines
    assert (tmp_path / "state" / "cluster.id").read_text().strip() == "q1Sh-9_ISia_zwGINzRvyQ", "one cluster id for every node"


def test_a_cluster_refuses_sasl_and_tls_and_a_node_it_does_not_have(tmp_path: Path) -> None:
    refused = _run(tmp_path, "start", START_TOOLS, {"WEIR_KAFKA_NODES": "3", "WEIR_KAFKA_SASL": "1"})
    assert refused.returncode != 0
    assert "runs without SASL and TLS" in refused.stderr
    env = {"PATH": str(tmp_path / "bin"), "WEIR_STATE_DIR": str(tmp_path / "state"), "WEIR_KAFKA_NODES": "3"}
    done = subprocess.run(
        [str(tmp_path / "bin" / "bash"), str(SCRIPT), "kill-node", "4"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode != 0
    assert "no node 4: WEIR_KAFKA_NODES=3" in done.stderr


def test_a_proxied_listener_is_advertised_on_the_proxy_s_port(tmp_path: Path) -> None:
    port, controller, proxy, proxied = (_free_port() for _ in range(4))
    _start_with_fake_java(
        tmp_path,
        with_openssl=False,
        WEIR_KAFKA_PORT=str(port),
        WEIR_KAFKA_CONTROLLER_PORT=str(controller),
        WEIR_KAFKA_PROXY_PORT=str(proxy),
        WEIR_KAFKA_PROXIED_PORT=str(proxied),
    )
    lines = _config(tmp_path).splitlines()
    assert f"listeners=PLAINTEXT://127.0.0.1:{port},PROXIED://127.0.0.1:{proxied},CONTROLLER://127.0.0.1:{controller}" in lines
    assert f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},PROXIED://127.0.0.1:{proxy}" in lines
    assert "inter.broker.listener.name=PLAINTEXT" in lines, "the broker's own traffic does not go through the proxy"
    assert "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT" in lines


def test_several_proxied_listeners_each_advertise_their_own_proxy(tmp_path: Path) -> None:
    """A listener per worker: each behind a proxy of its own, so that one of them can be cut off alone."""
    port, controller, proxy_1, proxied_1, proxy_2, proxied_2 = (_free_port() for _ in range(6))
    _start_with_fake_java(
        tmp_path,
        with_openssl=False,
        WEIR_KAFKA_PORT=str(port),
        WEIR_KAFKA_CONTROLLER_PORT=str(controller),
        WEIR_KAFKA_PROXY_PORT=f"{proxy_1},{proxy_2}",
        WEIR_KAFKA_PROXIED_PORT=f"{proxied_1},{proxied_2}",
    )
    lines = _config(tmp_path).splitlines()
    listeners = f"PLAINTEXT://127.0.0.1:{port},PROXIED1://127.0.0.1:{proxied_1},PROXIED2://127.0.0.1:{proxied_2}"
    assert f"listeners={listeners},CONTROLLER://127.0.0.1:{controller}" in lines
    assert f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},PROXIED1://127.0.0.1:{proxy_1},PROXIED2://127.0.0.1:{proxy_2}" in lines
    assert "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,PROXIED1:PLAINTEXT,PROXIED2:PLAINTEXT,CONTROLLER:PLAINTEXT" in lines
