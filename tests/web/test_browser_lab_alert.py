"""The demo's route switch, measured in the WAN lab by the real scheduler and alert watcher, as
the target page draws it in chromium: the route change line, the RTT step's alert attributed
to the route (orange, on the RTT chart), and the outage after the path's link is taken down.

Only cern and the routers to it are built, and only ping and traceroute run, so a cycle takes
a couple of seconds: the detector's warm-up, the switch and the outage fit in well under a
minute."""

from __future__ import annotations

import asyncio
import tomllib
from datetime import datetime
from typing import Any

import pytest

from iepm.analysis.alerts import load_alerts
from iepm.demo import TOPOLOGY, Demo
from iepm.lab.testing import lab_unavailable, unique_lab_name
from iepm.web.server import serve_in_background
from testkit.browser import shoot
from testkit.net import free_port
from tests.web.test_browser_lab_live import in_thread

# timing: the route switch's RTT step must stand out of a busy host's noise to raise its alert.
pytestmark = [pytest.mark.lab, pytest.mark.browser, pytest.mark.timing]

KEEP = {"mon", "gw", "core", "euro", "backup", "cern"}
CALM_CYCLES = 6  # the detector's warm-up (5 samples) and one more
AFTER_SWITCH = 3  # the alert must come within 3 cycles of the switch
DOWN = {"action": "link", "link": "backup_2", "up": False}

# The orange alert line's colour at a pixel of the chart (#e07000), given the chart's id and
# the alert's time: read from the canvas, so it is drawn, not only specified.
ALERT_PIXEL = """([id, t]) => {
  const u = window.iepmCharts[id];
  const x = Math.round(u.valToPos(t, 'x', true));
  const y = Math.round(u.bbox.top + u.bbox.height * 0.6);
  const ctx = u.ctx;
  for (let dx = -1; dx <= 1; dx++) {
    const [r, g, b, a] = ctx.getImageData(x + dx, y, 1, 1).data;
    if (a > 0 && Math.abs(r - 0xe0) < 24 && Math.abs(g - 0x70) < 24 && b < 40) return true;
  }
  return false;
}"""


def cern_only() -> dict[str, Any]:
    topology = tomllib.loads(TOPOLOGY.read_text(encoding="utf-8"))
    topology["hosts"] = [h for h in topology["hosts"] if h["name"] in KEEP]
    topology["links"] = [
        link for link in topology["links"] if link["a"] in KEEP and link["b"] in KEEP
    ]
    topology.pop("traffic")
    (switch,) = topology.pop("events")  # applied by the test between two cycles
    topology["switch"] = switch
    return topology


def test_target_page_draws_the_route_change_its_alert_and_the_outage(
    page: Any, tmp_path: Any, _stale_labs_swept: Any
) -> None:
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    topology = cern_only()
    switch = topology.pop("switch")
    with Demo.start(
        tmp_path, topology=topology, lab_name=unique_lab_name("alert"), say=lambda _: None
    ) as demo:
        assert demo.mode == "lab"
        (target,) = demo.config.targets
        target.probes = ["ping", "traceroute"]
        scheduler = demo.open()
        assert scheduler.alert_watcher is not None
        archive = demo.archive
        assert archive is not None
        switched_at: list[datetime] = []
        cycles_to_alert: list[int] = []

        def measure() -> None:
            async def run() -> None:
                for _ in range(CALM_CYCLES):
                    await scheduler.run_cycle()
                assert load_alerts(archive) == []  # a calm path: no alert
                await asyncio.to_thread(demo.lab.apply, switch)
                switched_at.append(datetime.now().astimezone())
                for n in range(1, AFTER_SWITCH + 1):
                    await scheduler.run_cycle()
                    # The route alert comes at the switch's own traceroute; the RTT step's
                    # within 3 cycles of it.
                    if any(a.metric == "rtt_avg_ms" for a in load_alerts(archive)):
                        cycles_to_alert.append(n)
                        break
                # cern's only path is cut: its ping and traceroute fail from now on.
                await asyncio.to_thread(demo.lab.apply, DOWN)
                await scheduler.run_cycle()

            asyncio.run(run())

        in_thread(measure, timeout_s=240.0)
        alerts = load_alerts(archive)
        assert cycles_to_alert, "no alert within 3 cycles of the route switch"
        # One event, two alerts: the route change (its own alert since issue 15) and the RTT
        # step it caused, which names it.
        assert len(alerts) == 2, [a.summary for a in alerts]
        route, alert = alerts
        assert (route.metric, route.direction, route.cause) == ("route", "changed", "route")
        assert (alert.metric, alert.direction, alert.cause) == ("rtt_avg_ms", "up", "route")
        assert alert.details["route"]["alert_id"] == route.id
        assert route.change_at >= switched_at[0]
        assert alert.change_at >= switched_at[0]
        assert alert.details["route"]["after"][-2] == demo.lab.address("backup")
        handle = serve_in_background(demo.config.monitor.archive, "127.0.0.1", free_port())
        try:
            page.goto(f"{handle.url}targets/cern?window=1h")
            page.wait_for_function("window.iepmCharts && window.iepmCharts.rtt")
            spec = page.evaluate(
                "JSON.parse(document.querySelector('#fig-rtt script.chart-spec').textContent)"
            )
            # One route change (no false ones from the dead runs' unanswered hops).
            assert len(spec["events"]) == 1
            assert spec["events"][0] == pytest.approx(alert.change_at.timestamp(), abs=5)
            (drawn,) = spec["alerts"]
            assert drawn["label"] == "ping.rtt_avg_ms up: route"
            assert drawn["t"] == alert.change_at.timestamp()
            page.locator("#chart-rtt").scroll_into_view_if_needed()
            assert page.evaluate(ALERT_PIXEL, ["rtt", drawn["t"]]), "alert line not drawn"
            # The outage: shaded with the probe's reason, the dead run plotted at 100 % loss.
            (outage,) = spec["outages"]
            assert outage["reason"].startswith("failed: ")
            assert page.evaluate("window.iepmCharts.loss.data[1].at(-1)") == 100
            rows = page.locator("#table-alerts tbody tr")
            assert rows.count() == 2  # newest first: the RTT step, then the route change
            assert "route" in rows.first.inner_text()
            assert "traceroute.route" in rows.nth(1).inner_text()
            shoot(page, "lab-alert-target")
        finally:
            handle.stop()
