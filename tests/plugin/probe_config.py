"""The hostile probe's cases: config."""

from __future__ import annotations

from tests.plugin.probekit import Case

CASES: list[Case] = []
