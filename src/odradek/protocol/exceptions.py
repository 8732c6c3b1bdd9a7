"""The one error type every decoder raises on malformed input.

Anything read from the wire that is truncated, oversized, out of order or otherwise invalid ends in a
`ProtocolError`; callers (the broker's connection, the client's connection) catch exactly this type and
answer with an error code or close the connection. No other exception type escapes a decoder.
"""


class ProtocolError(Exception):
    """Malformed or unsupported bytes on the wire."""


class UnsupportedVersionError(ProtocolError):
    """A request names an API key or version this side does not know."""

    def __init__(self, api_key: int, api_version: int, header=None) -> None:
        super().__init__(f"unsupported api key {api_key} version {api_version}")
        self.api_key = api_key
        self.api_version = api_version
        self.header = header  # the parsed RequestHeader, when the error comes from a request
