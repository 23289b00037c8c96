"""Where each target is: its ``site`` and ``group`` from targets.toml.

Results name their target but not its site or group (a target may be regrouped without
rewriting its history), so the web app learns them from the configuration it is given
(``iepm serve --config targets.toml``; the demo passes its own). Without one, every target is
in no group and the pages are not grouped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from iepm.config import Config


class Place(NamedTuple):
    site: str | None = None
    group: str | None = None


Places = Mapping[str, Place]
GROUP_TEXT = "the target's group in targets.toml (empty: none, or no --config)"
SITE_TEXT = "the target's site in targets.toml (empty: none, or no --config)"
NOWHERE = Place()


def places_of(config: Config) -> dict[str, Place]:
    """Each configured target's place."""
    return {t.name: Place(t.site, t.group) for t in config.targets}


def sort_key(places: Places, target: str) -> tuple[str, str, str]:
    """Targets ordered by group, then site, then name (no group or site sorts first)."""
    place = places.get(target, NOWHERE)
    return (place.group or "", place.site or "", target)
