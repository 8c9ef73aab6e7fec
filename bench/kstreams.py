"""The split/aggregate work on Kafka Streams (bench/kstreams/, Java 17, built by Maven), for `python -m bench.compare`.

``command()`` builds the application with ``mvn package`` when its jar is missing or older than its sources (the
first run resolves Kafka Streams' jars, as scripts/broker.sh resolves the broker's) and returns the command that
runs one process of it. bench/compare.py starts as many such processes, one application id, as weir runs workers
for the same work, with the environment bench/kstreams/src/main/java/dev/weir/bench/SplitAggregate.java reads
(BENCH_KSTREAMS_FORM ``inline`` or ``chunks``, the topics, the commit interval, the producer linger, the catalogue).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from weir.app.processes import ROOT

__all__ = ["FORMS", "command"]

PROJECT = ROOT / "bench" / "kstreams"
JAR = PROJECT / "target" / "weir-bench-kstreams-1.jar"
MAIN = "dev.weir.bench.SplitAggregate"
#: The values of BENCH_KSTREAMS_FORM.
FORMS = ("inline", "chunks")
#: The JVM's heap, as the local broker's (scripts/broker.sh): fixed, so that runs compare.
HEAP = ("-Xms256m", "-Xmx1g")


def _stale() -> bool:
    if not JAR.exists():
        return True
    built = JAR.stat().st_mtime
    sources = [PROJECT / "pom.xml", *(PROJECT / "src").rglob("*.java")]
    return any(source.stat().st_mtime > built for source in sources)


def command() -> list[str]:
    """``java ... SplitAggregate``, built first if needed (raises with Maven's output if the build fails)."""
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            message = f"bench.kstreams: {tool} is required (Java 17 and Maven, as for the local broker)"
            raise RuntimeError(message)
    if _stale():
        print("  kstreams: building bench/kstreams with mvn (the first run resolves Kafka Streams' jars)...", flush=True)
        built = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(PROJECT / "pom.xml"), "package", "-DskipTests"], capture_output=True, text=True, check=False
        )
        if built.returncode != 0:
            message = f"bench.kstreams: mvn package failed:\n{(built.stdout + built.stderr)[-3000:]}"
            raise RuntimeError(message)
    classpath = f"{JAR}:{PROJECT / 'target' / 'lib'}/*"
    logging = f"-Dlog4j2.configurationFile={Path(PROJECT / 'log4j2.properties')}"
    return ["java", *HEAP, "-XX:+UseG1GC", logging, "-cp", classpath, MAIN]
