"""The topology overlay in ONOS's legacy GUI, seen in a real browser: headless Chromium
(Debian's `chromium` and `chromium-driver`, driven by selenium) logs in, opens the topology
view of a real ONOS 2.7.0 whose null-provider fabric carries a job the service placed,
selects our overlay from the toolbar, shows the job with V, and the page must show what
the overlay promises: the job's panel, its aggregators badged with their fan-in, its
workers (W) and parameter server (PS) badged, the rest of the fabric subdued.

Set INNET_AGG_GUI_SCREENSHOT to a path to keep the screenshot (`make gui-screenshot` writes
docs/images/onos-gui-overlay.png). Skipped, with the reason, without ONOS or Chromium.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agg_optimizer.service import onosd

OVERLAY_ID = "innet-agg-overlay"  # innetAggTopovOverlay.js
OVERLAY_GLYPH = f"{OVERLAY_ID}-funnel"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip(
            "no Chromium here: Debian's `chromium` and `chromium-driver` packages run this test"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,900",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # for `_why` on a failure
    drv = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    try:
        yield drv
    finally:
        drv.quit()


@pytest.fixture
def placed_job(onos_real: onosd.OnosServer, onos_service: TestClient) -> Iterator[dict]:
    """A job placed by the service: AGG's aggregators through the app, intents in ONOS."""
    hosts = sorted(h["id"] for h in onos_real.get("/hosts")["hosts"])
    job = {"id": "resnet-gui", "workers": hosts[:5], "ps": hosts[5], "update_bytes": 10**8}
    c = onos_service
    assert c.post("/api/v1/jobs", json=job).status_code == 201
    res = c.post("/api/v1/jobs/resnet-gui/placement").json()
    assert res["status"] == "applied" and res["aggregation"] == "applied", res
    yield {**res["placement"], "ps": job["ps"]}
    assert c.delete("/api/v1/jobs/resnet-gui").status_code == 200


NODES_JS = """
return Array.from(document.querySelectorAll('#ov-topo svg g.node')).map(function (g) {
    var badge = g.querySelector('g.badge text');
    return {id: g.id, cls: g.getAttribute('class'), badge: badge ? badge.textContent : null};
});
"""


PAGE_STATE_JS = """
var panel = document.querySelector('#innet-agg-job-panel');
var flash = document.querySelector('#flash');
var buttons = Array.from(document.querySelectorAll('div.radioButton')).map(function (b) {
    var use = b.querySelector('use');
    return (use ? (use.getAttribute('xlink:href') || use.getAttribute('href')) : '?') + ' '
        + b.getAttribute('class');
});
return {panel: panel ? panel.outerHTML.slice(0, 600) : null,
        flash: flash ? flash.textContent : null, overlayButtons: buttons};
"""


def _why(browser: Any, onos: onosd.OnosServer, job: str) -> str:
    """What the page and ONOS said, for a failure's message (CI runs 18 and 22 saw no panel
    in 30 and 120 s, and the test passed alone each time)."""
    parts = []
    try:
        parts.append(f"page: {browser.execute_script(PAGE_STATE_JS)}")
        logs = [e.get("message", "") for e in browser.get_log("browser")]
        parts.append("browser console: " + " | ".join(logs[-15:]))
    except Exception as e:  # the browser itself may be what failed
        parts.append(f"browser unreadable: {e!r}")
    log = [ln for ln in onos.karaf_log().splitlines() if "| WARN" in ln or "| ERROR" in ln]
    parts.append("ONOS warnings: " + " | ".join(log[-15:]))
    try:
        parts.append(f"the job in the app: {onos.get(f'/onos/innet-agg/aggregation/{job}')}")
    except Exception as e:
        parts.append(f"the job unreadable in the app: {e!r}")
    return "\n".join(parts)


def safe(element_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", element_id)


def test_the_overlay_shows_a_placed_job(
    onos_real: onosd.OnosServer, browser: Any, placed_job: dict
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    ui = f"{onos_real.root}/onos/ui"
    browser.get(f"{ui}/login.html")
    browser.find_element(By.ID, "username").send_keys(onos_real.auth[0])
    browser.find_element(By.ID, "password").send_keys(onos_real.auth[1])
    browser.find_element(By.ID, "submit").click()
    browser.get(f"{ui}/index.html#/topo")
    devices = {d["id"] for d in onos_real.get("/devices")["devices"]}
    onosd.wait_for(
        lambda: (
            len([n for n in browser.execute_script(NODES_JS) if "device" in n["cls"]])
            == len(devices)
        ),
        60,
        "every device drawn",
    )
    # The GUI keeps a user's view settings in ONOS (hosts shown, toolbar open, overlay): take
    # the page from whatever an earlier session left to the same state.
    prefs = onos_real.get("/ui/preferences/onos").get("topo_prefs", {})
    keys = ActionChains(browser)
    if not prefs.get("hosts"):
        keys.send_keys("h").perform()  # hosts are hidden by default: H shows them
    if not prefs.get("toolbar"):
        browser.find_element(By.CSS_SELECTOR, ".tbar-arrow").click()

    def overlay_button(glyph: str) -> Any:
        return onosd.wait_for(
            lambda: browser.find_elements(
                By.XPATH,
                f"//div[contains(@class,'radioButton')][.//*[local-name()='use']"
                f"[contains(@*[local-name()='href'],'{glyph}')]]",
            ),
            30,
            f"the toolbar's overlay button {glyph}",
        )[0]

    def click(glyph: str) -> None:
        from selenium.common.exceptions import (
            ElementClickInterceptedException,
            ElementNotInteractableException,
        )

        def clicked() -> bool:
            try:
                overlay_button(glyph).find_element(By.TAG_NAME, "svg").click()
            except (ElementClickInterceptedException, ElementNotInteractableException):
                # the toolbar is still sliding in
                return False
            return True

        onosd.wait_for(clicked, 60, f"a click on {glyph}")

    def select_overlay() -> None:
        # The page, not the stored preferences, says whether it is selected already (then
        # selecting it again would do nothing).
        if prefs.get("ovid") == OVERLAY_ID or "selected" in (
            overlay_button(OVERLAY_GLYPH).get_attribute("class") or ""
        ):
            click("m_unknown")  # the 'no overlay' button
        click(OVERLAY_GLYPH)

    select_overlay()
    # V shows a job (again: it is no toggle). A V pressed before the overlay has finished
    # activating reaches no binding (CI run 18: no panel in 30 s), so it is pressed again
    # every 5 s until the panel is there.
    pressed = [0.0]

    def panel_shown() -> list[Any]:
        found = browser.find_elements(By.CSS_SELECTOR, "#innet-agg-job-panel h2")
        if not found and time.monotonic() - pressed[0] > 5:
            ActionChains(browser).send_keys("V").perform()
            pressed[0] = time.monotonic()
        return found

    try:
        panel = onosd.wait_for(panel_shown, 60, "the job panel after V")
    except AssertionError as e:
        # CI run 22 (full suite) saw no panel in 120 s; alone it passed every time. Select
        # the overlay once more, as a user would, and say so with what the page showed.
        why = _why(browser, onos_real, placed_job["job_id"])
        warnings.warn(f"{e}; the overlay selected again. {why}", stacklevel=1)
        prefs = {}
        select_overlay()
        try:
            panel = onosd.wait_for(panel_shown, 60, "the job panel after V, overlay reselected")
        except AssertionError as e2:
            raise AssertionError(
                f"{e2}\n{_why(browser, onos_real, placed_job['job_id'])}"
            ) from None
    onosd.wait_for(lambda: panel[0].text == "resnet-gui", 120, "the job's panel")

    badges = {placed_job["ps"]: "PS"}
    for agg in placed_job["aggregators"]:
        badges[agg["switch"]] = str(agg["fan_in"])
    for worker in placed_job["worker_paths"]:
        badges[worker] = "W"

    def drawn() -> dict[str, str]:
        return {n["id"]: n["badge"] for n in browser.execute_script(NODES_JS) if n["badge"]}

    assert list(badges.values()).count("W") == 5 and len(placed_job["aggregators"]) >= 1
    expected = {safe(k): v for k, v in badges.items()}
    onosd.wait_for(
        lambda: all(drawn().get(k) == v for k, v in expected.items()),
        30,
        f"badges {expected}, drawn: {drawn()}",
    )
    nodes = browser.execute_script(NODES_JS)
    subdued = [n["id"] for n in nodes if "suppressed" in (n["cls"] or "")]
    assert subdued, "nothing outside the job is subdued"
    assert not set(subdued) & set(expected), "an element of the job is subdued"

    # For the picture: the pointer off the toolbar's tooltips, the H key's flash message gone.
    ActionChains(browser).move_to_element(panel[0]).perform()
    onosd.wait_for(
        lambda: not browser.find_elements(By.CSS_SELECTOR, "#flash svg"), 10, "flash gone"
    )
    shot = os.environ.get("INNET_AGG_GUI_SCREENSHOT")
    path = Path(shot) if shot else Path(onos_real.dir) / "gui-overlay.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
