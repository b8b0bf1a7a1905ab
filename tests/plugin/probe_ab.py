"""The hostile probe's cases: ab."""

from __future__ import annotations

from tests.plugin.probekit import Case

CASES: list[Case] = []
