"""SaslHandshake (key 17) and SaslAuthenticate (key 36) as Kafka answers them where no SASL exchange
is going on (seed 003, "SaslHandshake API"; KIP-43, KIP-152).

Kafka's SASL authenticator handles these two before a connection is authenticated, on listeners whose
security protocol is SASL_PLAINTEXT or SASL_SSL; a request that reaches the request handlers instead
(a listener without SASL, or a connection already authenticated) is answered ILLEGAL_SASL_STATE, and
SaslHandshake lists no mechanism (KafkaApis.handleSaslHandshakeRequest). odradek authenticates no
mechanism yet: on a SASL listener a handshake is answered UNSUPPORTED_SASL_MECHANISM with the
mechanisms `sasl.enabled.mechanisms` names, what Kafka answers for a mechanism it does not offer.
Either way the connection stays open, as in Kafka.
"""

from __future__ import annotations

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import sasl_authenticate as sa
from odradek.protocol.messages import sasl_handshake as sh
from odradek.server.context import RequestContext

AUTHENTICATED_MESSAGE = "SaslAuthenticate request received after successful authentication"


def listener_uses_sasl(ctx: RequestContext) -> bool:
    if ctx.listener_name is None:
        return False
    return ctx.config.listener_security_protocol_map.get(ctx.listener_name, "").startswith("SASL_")


async def handle_sasl_handshake(ctx: RequestContext, request: sh.SaslHandshakeRequest) -> sh.SaslHandshakeResponse:
    if listener_uses_sasl(ctx):
        return sh.SaslHandshakeResponse(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                        mechanisms=list(ctx.config.get("sasl.enabled.mechanisms")))
    return sh.SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])


async def handle_sasl_authenticate(ctx: RequestContext,
                                   request: sa.SaslAuthenticateRequest) -> sa.SaslAuthenticateResponse:
    return sa.SaslAuthenticateResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, error_message=AUTHENTICATED_MESSAGE,
                                       auth_bytes=b"", session_lifetime_ms=0)
