"""``[[targets]] site`` and ``group`` group the overview and the route map: the web app learns
them from targets.toml (``iepm serve --config``), as results carry only the target's name."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from iepm.config import load_config
from iepm.results import format_time
from iepm.web.app import create_app
from iepm.web.places import Place, places_of
from tests.web import data

END = format_time(data.END)
TARGETS_TOML = """
[[targets]]
name = "cern-1"
address = "198.18.3.2"
site = "CERN"
group = "europe"

[[targets]]
name = "bnl-2"
address = "198.18.4.2"
site = "BNL"
group = "americas"

[[targets]]
name = "kek-3"
address = "198.18.5.2"
site = "KEK"
group = "asia"
"""


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "targets.toml"
    path.write_text(TARGETS_TOML, encoding="utf-8")
    return path


def rows(client: TestClient, url: str) -> list[dict[str, str]]:
    response = client.get(url)
    assert response.status_code == 200, response.text
    return list(csv.DictReader(io.StringIO(response.text)))


def test_places_come_from_targets_toml(config_path: Path) -> None:
    places = places_of(load_config(config_path))
    assert places["cern-1"] == Place(site="CERN", group="europe")
    assert places["kek-3"] == Place(site="KEK", group="asia")


def test_overview_and_route_map_are_grouped(archive_url: str, config_path: Path) -> None:
    places = places_of(load_config(config_path))
    with TestClient(create_app(archive_url, cache_ttl_s=0, places=places)) as client:
        page = client.get(f"/?until={END}").text
        grid = page[page.index('id="grid"') : page.index("</table>", page.index('id="grid"'))]
        # Groups in order (americas, asia, europe), each heading its targets.
        order = [grid.index(s) for s in ("americas", "bnl-2", "asia", "kek-3", "europe", "cern-1")]
        assert order == sorted(order)
        assert 'class="site">CERN<' in grid
        paths = rows(client, f"/tables/paths?until={END}")
        assert {(r["target"], r["group"], r["site"]) for r in paths} >= {
            ("cern-1", "europe", "CERN"),
            ("bnl-2", "americas", "BNL"),
            ("kek-3", "asia", "KEK"),
        }
        routes = rows(client, f"/tables/route_paths?until={END}")
        assert [r["target"] for r in routes] == ["bnl-2", "bnl-2", "kek-3", "cern-1"]
        assert [r["group"] for r in routes] == ["americas", "americas", "asia", "europe"]
        labels = page[page.index('class="routemap"') : page.index("</svg>")]
        for group in ("americas", "asia", "europe"):
            assert 'class="group"' in labels and f">{group}</text>" in labels


def test_without_a_config_nothing_is_grouped(client: TestClient) -> None:
    page = client.get(f"/?until={END}").text
    assert '<tr class="group">' not in page and '<text class="group"' not in page
    assert {r["group"] for r in rows(client, f"/tables/paths?until={END}")} == {""}


def test_serve_workers_read_the_config_from_the_environment(
    archive_url: str, config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from iepm.web.server import CONFIG_ENV, URL_ENV, app_from_env

    monkeypatch.setenv(URL_ENV, archive_url)
    monkeypatch.setenv(CONFIG_ENV, str(config_path))
    app = app_from_env()
    assert app.state.web.places["bnl-2"] == Place("BNL", "americas")  # type: ignore[attr-defined]
