"""Option values as users write them: true or false in any case, or a bool."""

from __future__ import annotations

from tally.errors import InvalidOptionError


def parse_bool_option(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise InvalidOptionError(f"Invalid value for option '{key}': {value!r} (expected true or false)")
    return text == "true"
