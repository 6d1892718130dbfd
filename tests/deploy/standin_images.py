"""The stand-in images the deploy tests need where no registry can be reached
(tests/deploy/standins/README.md), built from what is reachable: Debian's mirror
(debootstrap), Maven Central, and this machine's own builds of InfluxDB 1.8.10 and ONOS
2.7.0 (`make influxdb`, `make onos`).

An image that exists without our label (pulled from a registry, or built by a user) is
never touched. A stand-in carries the label `org.innetagg.standin=<digest of its inputs>`
and is rebuilt only when that digest changes, so a warm run costs a few `docker image
inspect` calls, not a 700 MB build context.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "standins"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "innet-agg"
INFLUXD = CACHE / "influxdb-1.8.10" / "bin" / "influxd"
ONOS_TREE = CACHE / "onos-2.7.0" / "onos-2.7.0"
JAVA11 = CACHE / "jre-11.0.13.1" / "java-runtime"
ROOTFS = CACHE / "standin-rootfs-bookworm"
MAVEN_VERSION = "3.9.16"
MAVEN_URL = (
    "https://repo1.maven.org/maven2/org/apache/maven/apache-maven/"
    f"{MAVEN_VERSION}/apache-maven-{MAVEN_VERSION}-bin.tar.gz"
)
LABEL = "org.innetagg.standin"
DEBIAN = "standin/debian:bookworm"
PYTHON = "python:3.11-slim-bookworm"
MAVEN = "maven:3.9-eclipse-temurin-17"
INFLUXDB = "influxdb:2.7"
ONOS = "onosproject/onos:2.7.0"
POSTGRES = "postgres:15"
FRONTEND = "docker/dockerfile:1"
BUILD_TIMEOUT_S = 1800  # apt and Maven downloads on a loaded 2-core machine


class StandInError(Exception):
    """A stand-in could not be built; one line."""


def docker(*args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kw)


def label(tag: str) -> str | None:
    """Our label of an image, "" if it exists without one, None if it does not exist."""
    r = docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{LABEL}"}}}}', tag)
    if r.returncode:
        return None
    value = r.stdout.strip()
    return "" if value in ("", "<no value>") else value


def image_id(tag: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def digest(*parts: bytes | str | Path) -> str:
    """Of files' contents (directories: every file's path and contents) and strings."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Path):
            files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
            for f in files:
                h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
                h.update(f.read_bytes())
        else:
            h.update(p.encode() if isinstance(p, str) else p)
    return h.hexdigest()[:16]


def stamp(path: Path) -> str:
    """Cheap identity of a large tree built elsewhere: its path and key files' size and time."""
    st = path.stat()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def ensure(tag: str, want: str, build: Callable[[Path], None], log: Callable[[str], None]) -> str:
    have = label(tag)
    if have == "":
        log(f"{tag}: a real image is present, kept")
        return "real"
    if have == want:
        return "current"
    log(f"{tag}: building the stand-in ({'absent' if have is None else 'inputs changed'})")
    with tempfile.TemporaryDirectory(prefix="standin-") as tmp:
        build(Path(tmp))
    if label(tag) != want:
        raise StandInError(f"{tag}: built, but it does not carry {LABEL}={want}")
    return "built"


def _build(tag: str, ctx: Path, want: str, *args: str) -> None:
    r = docker("build", "-t", tag, "--label", f"{LABEL}={want}", *args, str(ctx),
               timeout=BUILD_TIMEOUT_S)  # fmt: skip
    if r.returncode:
        raise StandInError(f"building the stand-in {tag}: {r.stderr.strip()[-2000:]}")


def trust_store() -> list[Path]:
    """The host's CA certificates: HTTPS from inside the images goes out as the host's
    does (here through a TLS-intercepting proxy only the host's store trusts)."""
    return [p for p in (Path("/etc/ssl/certs"), Path("/usr/local/share/ca-certificates"))
            if p.is_dir()]  # fmt: skip


def debian(log: Callable[[str], None]) -> str:
    """A minimal Debian bookworm root from Debian's mirror, with the host's trust store."""
    certs = Path("/etc/ssl/certs/ca-certificates.crt")
    want = digest(b"bookworm minbase 1", certs if certs.exists() else b"")

    def build(tmp: Path) -> None:
        if shutil.which("debootstrap") is None:
            raise StandInError("no debootstrap (apt-get install debootstrap) for " + DEBIAN)
        if not (ROOTFS / ".complete").exists():
            shutil.rmtree(ROOTFS, ignore_errors=True)
            ROOTFS.parent.mkdir(parents=True, exist_ok=True)
            log(f"{DEBIAN}: debootstrap --variant=minbase bookworm into {ROOTFS}")
            r = subprocess.run(
                ["debootstrap", "--variant=minbase", "bookworm", str(ROOTFS),
                 "http://deb.debian.org/debian"],
                capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
            )  # fmt: skip
            if r.returncode:
                raise StandInError(f"debootstrap: {(r.stdout + r.stderr).strip()[-1500:]}")
            for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for f in (ROOTFS / d).glob("*"):
                    if f.is_file():
                        f.unlink()
            (ROOTFS / ".complete").touch()
        for src in trust_store():
            dst = ROOTFS / src.relative_to("/")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst, symlinks=False)
        tar = subprocess.Popen(["tar", "--numeric-owner", "--exclude=./.complete", "-C",
                                str(ROOTFS), "-c", "."], stdout=subprocess.PIPE)  # fmt: skip
        r = subprocess.run(
            ["docker", "import", "-c", f"LABEL {LABEL}={want}",
             "-c", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "-c", 'CMD ["bash"]', "-", DEBIAN],
            stdin=tar.stdout, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
        )  # fmt: skip
        tar.wait()
        if r.returncode or tar.returncode:
            raise StandInError(f"docker import of {ROOTFS}: {r.stderr.strip()[-1500:]}")

    ensure(DEBIAN, want, build, log)
    return image_id(DEBIAN)


def maven_tarball() -> Path:
    """Apache Maven from Maven Central, its published SHA-512 checked; cached."""
    dest = CACHE / "downloads" / MAVEN_URL.rsplit("/", 1)[1]
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(MAVEN_URL + ".sha512", timeout=60) as r:
        expected = r.read().decode().split()[0]
    with urllib.request.urlopen(MAVEN_URL, timeout=300) as r:
        data = r.read()
    if hashlib.sha512(data).hexdigest() != expected:
        raise StandInError(f"{MAVEN_URL}: SHA-512 differs from the published one")
    part = dest.with_suffix(".part")
    part.write_bytes(data)
    part.rename(dest)
    return dest


def base_images(log: Callable[[str], None]) -> None:
    """python:3.11-slim-bookworm and maven:3.9-eclipse-temurin-17, unless real ones exist."""
    for tag, name in ((PYTHON, "python"), (MAVEN, "maven")):
        if label(tag) == "":
            log(f"{tag}: a real image is present, kept")
            continue
        parent = debian(log)
        want = digest(HERE / name, parent, MAVEN_VERSION if name == "maven" else "")

        def build(tmp: Path, name: str = name, tag: str = tag, want: str = want) -> None:
            ctx = tmp / name
            shutil.copytree(HERE / name, ctx)
            args: list[str] = []
            if name == "maven":
                shutil.copy2(maven_tarball(), ctx)
                args = ["--build-arg", f"MAVEN_VERSION={MAVEN_VERSION}"]
            _build(tag, ctx, want, *args)

        ensure(tag, want, build, log)


def services(log: Callable[[str], None]) -> None:
    """influxdb:2.7 and onosproject/onos:2.7.0 from this machine's builds (README.md)."""
    parent = image_id(PYTHON)
    influx_want = digest(HERE / "influxdb", parent, stamp(INFLUXD))

    def influx(tmp: Path) -> None:
        ctx = tmp / "influxdb"
        shutil.copytree(HERE / "influxdb", ctx)
        shutil.copy2(INFLUXD, ctx / "influxd")
        _build(INFLUXDB, ctx, influx_want)

    ensure(INFLUXDB, influx_want, influx, log)
    tree = (ONOS_TREE / "bin" / "onos-service", ONOS_TREE / "apache-karaf-4.2.9")
    tree += (JAVA11 / "release",)
    onos_want = digest(HERE / "onos", parent, *(stamp(p) for p in tree))

    def onos(tmp: Path) -> None:
        ctx = tmp / "onos"
        shutil.copytree(HERE / "onos", ctx)
        shutil.copytree(ONOS_TREE, ctx / "onos", symlinks=True)
        shutil.copytree(JAVA11, ctx / "java", symlinks=True)
        _build(ONOS, ctx, onos_want)

    ensure(ONOS, onos_want, onos, log)


def postgres(log: Callable[[str], None] = print) -> None:
    """postgres:15 from Debian bookworm's PostgreSQL 15 (the cluster profile's database)."""
    parent = debian(log)
    want = digest(HERE / "postgres", parent)

    def build(tmp: Path) -> None:
        ctx = tmp / "postgres"
        shutil.copytree(HERE / "postgres", ctx)
        _build(POSTGRES, ctx, want)

    ensure(POSTGRES, want, build, log)


def missing_inputs() -> str | None:
    """What this machine lacks to build the stand-ins it does not already have, or None."""
    for what, path, tag in (
        ("influxd 1.8.10 (make influxdb)", INFLUXD, INFLUXDB),
        ("ONOS 2.7.0 (make onos)", ONOS_TREE / "bin" / "onos-service", ONOS),
        ("a Java 11 runtime (make onos)", JAVA11 / "release", ONOS),
    ):
        if label(tag) != "" and not path.exists():
            return f"no {what} at {path} for the stand-in {tag}"
    return missing_base()


def missing_base() -> str | None:
    """What this machine lacks to build the project's images (BuildKit, base images,
    frontend)."""
    # The Dockerfiles' `RUN --mount` needs BuildKit, which this engine's client reaches
    # through the buildx plugin: without it `docker build` falls back to the legacy builder
    # and fails (seen in CI once the stand-in base images were present, no plugin on PATH).
    r = docker("buildx", "version", timeout=30)
    if r.returncode != 0:
        said = (r.stderr or r.stdout).strip().splitlines()
        return f"no `docker buildx` (BuildKit, for RUN --mount): {said[0] if said else ''}"
    if label(FRONTEND) is None:
        return (
            f"no {FRONTEND} image (the Dockerfiles' `# syntax` frontend; pulled, or built "
            "from buildkit's frontend/dockerfile/cmd/dockerfile-frontend, docs/deploy.md)"
        )
    needs_base = any(label(t) != "" for t in (PYTHON, MAVEN))
    if needs_base and label(DEBIAN) is None and shutil.which("debootstrap") is None:
        return f"no debootstrap to build the stand-in base images {PYTHON} and {MAVEN}"
    return None


def build_all(log: Callable[[str], None] = print) -> None:
    base_images(log)
    services(log)


def remove_stale_projects(log: Callable[[str], None] = print) -> list[str]:
    """Compose projects of deploy tests whose pytest died before `down` (named
    innet-agg-test-[...-]<pid>, the pid gone): removed with their volumes, or their
    `restart: unless-stopped` services would come back with the next engine start and
    take the CPU from the run."""
    r = docker("compose", "ls", "-a", "--format", "json", timeout=60)
    removed = []
    for p in json.loads(r.stdout or "[]") if r.returncode == 0 else []:
        m = re.fullmatch(r"innet-agg-test-(?:.*-)?(\d+)", p.get("Name", ""))
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        log(f"removing the stale compose project {p['Name']}")
        docker("compose", "-p", p["Name"], "down", "-v", "--remove-orphans", timeout=300)
        removed.append(p["Name"])
    return removed


def main(argv: list[str] | None = None) -> int:
    """`uv run python tests/deploy/standin_images.py [--cluster]`: build the stand-ins a
    user of this machine needs before `docker compose up` (docs/deploy.md)."""
    import argparse
    import sys

    p = argparse.ArgumentParser(description="Build the local stand-in images (no registry).")
    p.add_argument("--cluster", action="store_true", help="also postgres:15 (cluster profile)")
    args = p.parse_args(argv)
    why = missing_inputs()
    if why:
        print(f"standin-images: error: {why}", file=sys.stderr)
        return 1
    try:
        build_all()
        if args.cluster:
            postgres()
    except StandInError as e:
        print(f"standin-images: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
