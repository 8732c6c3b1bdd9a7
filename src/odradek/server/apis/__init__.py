"""The dispatch table: API key -> handler (STYLE, "One module per API family")."""

from odradek.server.apis.api_versions import handle_api_versions
from odradek.server.apis.fetch import handle_fetch
from odradek.server.apis.list_offsets import handle_list_offsets
from odradek.server.apis.metadata import handle_metadata
from odradek.server.apis.produce import handle_produce
from odradek.server.apis.producer_ids import handle_init_producer_id

HANDLERS = {
    0: handle_produce,
    1: handle_fetch,
    2: handle_list_offsets,
    3: handle_metadata,
    18: handle_api_versions,
    22: handle_init_producer_id,
}
