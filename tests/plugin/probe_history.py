"""The hostile probe's cases: history."""

from __future__ import annotations

from tests.plugin.probekit import Case

CASES: list[Case] = []
