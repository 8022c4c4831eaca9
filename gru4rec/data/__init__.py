"""Click data: reading and validating event files, the item map, sessions as flat arrays."""
from gru4rec.data.events import ColumnKeys, read_events, validate_events, write_event_chunks, write_events
from gru4rec.data.items import ItemMap
from gru4rec.data.sessions import IndexedSessions, Sessions, index_sessions, item_support, sessions_from_events

__all__ = [
    "ColumnKeys",
    "ItemMap",
    "Sessions",
    "IndexedSessions",
    "index_sessions",
    "item_support",
    "read_events",
    "sessions_from_events",
    "validate_events",
    "write_event_chunks",
    "write_events",
]
