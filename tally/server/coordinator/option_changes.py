"""set_table_options on the coordinator: change the options of a live table that no stored
row or changelog record depends on (the lake's).

The new descriptor is the old one with the options set (a value of None removes one) and is
validated as a new table's would be, so a table whose columns the lake cannot hold is refused
before anything is stored; it replaces the old one with compare-and-set. Tablet servers are
not told: none of these options is read by a tablet. Enabling the lake on a table with rows
makes the first tiering round copy the table as it is, then its changes.
"""

from __future__ import annotations

import logging

from merge_engine.table.lake_options import LAKE_OPTIONS
from tally.errors import InvalidOptionError
from tally.wire.messages import field

log = logging.getLogger(__name__)

ALTERABLE_OPTIONS = frozenset(LAKE_OPTIONS)


class OptionChanges:
    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        coordinator.actions["set_table_options"] = self.set_options

    def set_options(self, body: dict) -> dict:
        from merge_engine import TableDescriptor

        coordinator = self.coordinator
        record = coordinator.named_table(body)
        changes = field(body, "options", dict)
        for key, value in changes.items():
            if key not in ALTERABLE_OPTIONS:
                raise InvalidOptionError(
                    f"option '{key}' cannot be changed on a live table; the options that can: "
                    f"{sorted(ALTERABLE_OPTIONS)}")
            if value is not None and not isinstance(value, (str, bool, int)):
                raise InvalidOptionError(f"option '{key}': {value!r} is not a text value")
        old = coordinator.parse_descriptor(record.descriptor)
        properties = dict(old.properties)
        for key, value in changes.items():
            if value is None:
                properties.pop(key, None)
            else:
                properties[key] = str(value).lower() if isinstance(value, bool) else str(value)
        new = TableDescriptor(old.schema, old.bucket_count, properties)
        if new.lake.enabled and not old.lake.enabled:
            coordinator.lake.check_enable(record.name)
        coordinator.catalog.set_descriptor(record.name, record.table_id, record.descriptor,
                                           new.to_json())
        log.info("table %s (id %d): options %s", record.name, record.table_id, changes)
        return {"table_id": record.table_id, "options": {
            k: v for k, v in new.properties.items() if k in ALTERABLE_OPTIONS}}
