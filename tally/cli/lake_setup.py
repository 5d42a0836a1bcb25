"""What `tally lake` says of the cluster's tiering set-up (the coordinator's `lake_setup`): its
lake directory, whether deltalake imports in the coordinator's Python and in this one, the
tiering processes heard from, and whether a table's lake can be turned on now."""

from __future__ import annotations

import importlib.util

from tally.cli.output import emit, header_for

LAKE_INSTALL = "pip install 'tally-aggregates[lake]'"


def local_deltalake() -> str | None:
    """The deltalake version this `tally` could import (without importing it: slow), or None."""
    try:
        if importlib.util.find_spec("deltalake") is None:
            return None
        from importlib.metadata import version

        return version("deltalake")
    except Exception:  # noqa: BLE001 - a broken install cannot tier either
        return None


def setup_rows(setup: dict) -> list[tuple]:
    """(WHAT, OK, DETAIL) per thing tiering needs, then per tiering process heard from."""
    root, coordinator, here = setup.get("root"), setup.get("deltalake"), local_deltalake()
    unready = setup.get("unready")
    rows = [("lake", unready is None,
             "a table's lake can be turned on" if unready is None else unready),
            ("lake directory", root is not None,
             root or "none: start the coordinator with --datalake-dir URI"),
            ("deltalake in the coordinator", coordinator is not None,
             coordinator or f"not importable: {LAKE_INSTALL}"),
            ("deltalake here", here is not None,
             here or f"not importable (`tally tier` here refuses): {LAKE_INSTALL}")]
    processes = setup.get("tier_processes", [])
    if not processes:
        rows.append(("tiering processes", False, "none heard from: start `tally tier`"))
    for p in processes:
        state = "live" if p["live"] else \
            f"not heartbeating (timeout {setup.get('tier_timeout')} s)"
        rows.append((f"tiering process {p['tier_id']}", p["live"],
                     f"{state}, heard {p['seen_seconds_ago']:.1f} s ago, deltalake "
                     f"{p['deltalake'] or 'not reported'}, {p['tables']} tables held"))
    return rows


def setup_lines(setup: dict) -> list[str]:
    """The rows as lines for people, problems marked."""
    return [f"{what}: {detail}" if ok else f"{what}: NOT OK: {detail}"
            for what, ok, detail in setup_rows(setup)]


def emit_setup(setup: dict, fmt: str) -> None:
    emit(header_for(("WHAT", "OK", "DETAIL"), fmt), setup_rows(setup), fmt)
