"""Click data: reading and validating event files, the item map, sessions as flat arrays."""
from gru4rec.data.events import (
    ItemMap,
    Sessions,
    item_support,
    read_events,
    sessions_from_events,
    validate_events,
    write_events,
)

__all__ = ["ItemMap", "Sessions", "item_support", "read_events", "sessions_from_events", "validate_events", "write_events"]
