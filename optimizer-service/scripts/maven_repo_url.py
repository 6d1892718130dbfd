"""Print the base URL of the repository Maven uses for `central` on this machine.

Order, as Maven applies it: a non-blocked mirror whose `mirrorOf` covers `central` in the
user settings (~/.m2/settings.xml), then the global settings ($MAVEN_HOME/conf/settings.xml);
otherwise the `central` repository declared in Maven's super POM (inside
maven-model-builder's jar). No host is written here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path


def maven_home() -> Path | None:
    if os.environ.get("MAVEN_HOME"):
        return Path(os.environ["MAVEN_HOME"])
    mvn = shutil.which("mvn")
    if not mvn:
        return None
    out = subprocess.run([mvn, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"Maven home: (.+)", re.sub(r"\x1b\[[0-9;]*m", "", out))
    return Path(m.group(1).strip()) if m else Path(mvn).resolve().parent.parent


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def covers_central(mirror_of: str) -> bool:
    parts = [p.strip() for p in mirror_of.split(",")]
    if "!central" in parts:
        return False
    return any(p in ("central", "*", "external:*", "external:https:*") for p in parts)


def mirror_url(settings: Path) -> str | None:
    if not settings.is_file():
        return None
    root = ET.parse(settings).getroot()
    for el in root.iter():
        if _local(el.tag) != "mirror":
            continue
        fields = {_local(c.tag): (c.text or "").strip() for c in el}
        if fields.get("blocked") == "true" or not fields.get("url"):
            continue
        if covers_central(fields.get("mirrorOf", "")):
            return fields["url"]
    return None


def super_pom_central(home: Path) -> str | None:
    for jar in sorted((home / "lib").glob("maven-model-builder-*.jar")):
        with zipfile.ZipFile(jar) as z:
            root = ET.fromstring(z.read("org/apache/maven/model/pom-4.0.0.xml"))
        for repo in root.iter():
            if _local(repo.tag) != "repository":
                continue
            fields = {_local(c.tag): (c.text or "").strip() for c in repo}
            if fields.get("id") == "central":
                return fields.get("url")
    return None


def main() -> int:
    home = maven_home()
    candidates = [Path.home() / ".m2" / "settings.xml"]
    if home:
        candidates.append(home / "conf" / "settings.xml")
    for settings in candidates:
        url = mirror_url(settings)
        if url:
            print(url.rstrip("/"))
            return 0
    url = super_pom_central(home) if home else None
    if not url:
        print(
            "maven_repo_url: Maven is not installed or has no central repository", file=sys.stderr
        )
        return 1
    print(url.rstrip("/"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
