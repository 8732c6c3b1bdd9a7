"""ApiVersions (key 18): the versions of every API this broker serves (seed 003, "ApiVersions API").

From v3 (KIP-511) the request names the client software; a name or version outside Kafka's pattern
(letters and digits, with '-' and '.' inside) is answered INVALID_REQUEST with no API list, as Kafka's
ApiVersionsRequest.isValid decides. An unsupported request version is answered in dispatch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.extensions import CLIENT_ASSIGNOR_APIS
from odradek.protocol.messages import APIS, api_versions as m
from odradek.server.context import RequestContext

H = TypeVar("H")

# Versions Apache Kafka marks unstable (latestVersionUnstable) are declared but not advertised.
CONSUMER_GROUP_HEARTBEAT = 68
UNSTABLE_LATEST = {22: 6}  # InitProducerId v6: two-phase commit (KIP-939)
# Feature levels (KIP-584): group.version 1 is the consumer group protocol (KIP-848), which this
# broker serves whenever ConsumerGroupHeartbeat is in its table.
GROUP_VERSION = "group.version"
GROUP_VERSION_LEVEL = 1
# transaction.version 2 is the transaction protocol v2 of KIP-890 part 2 (epoch bump per transaction,
# partitions added by their leaders), finalized as a new Kafka 4.0 cluster does; clients that speak it
# (the Java client from 4.0) switch to it on seeing this level.
TRANSACTION_VERSION = "transaction.version"
TRANSACTION_VERSION_LEVEL = 2
FINALIZED_FEATURES_EPOCH = 1
SOFTWARE_NAME_OR_VERSION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


CONSUMER_PROTOCOL_APIS = frozenset({68, 69})   # ConsumerGroupHeartbeat, ConsumerGroupDescribe


def enabled_handlers(handlers: Mapping[int, H], rebalance_protocols: Iterable[str],
                     client_assignors: bool = False) -> dict[int, H]:
    """The handler table without the consumer group protocol's APIs when
    `group.coordinator.rebalance.protocols` leaves out "consumer" (Kafka then does not offer them), and
    without the client-side assignor extension unless `group.consumer.client.assignors.enable`."""
    protocols = set(rebalance_protocols)
    return {k: h for k, h in handlers.items()
            if not (k in CONSUMER_PROTOCOL_APIS and "consumer" not in protocols)
            and not (k in CLIENT_ASSIGNOR_APIS and ("consumer" not in protocols or not client_assignors))}


def disabled_extensions(handlers: Mapping[int, H], answer: H) -> dict[int, H]:
    """`handlers` plus `answer` for each extension API it leaves out: such a request gets an
    UNSUPPORTED_VERSION answer rather than a closed connection, and the key is still not advertised."""
    return {**{k: answer for k in CLIENT_ASSIGNOR_APIS}, **handlers}


def supported(handlers: Iterable[int]) -> list[m.ApiVersion]:
    out = []
    for k in sorted(handlers):
        top = APIS[k].MAX_VERSION
        if UNSTABLE_LATEST.get(k) == top:
            top -= 1
        out.append(m.ApiVersion(api_key=k, min_version=APIS[k].MIN_VERSION, max_version=top))
    return out


def valid_software(request: m.ApiVersionsRequest) -> bool:
    return all(SOFTWARE_NAME_OR_VERSION.fullmatch(s or "") is not None
               for s in (request.client_software_name, request.client_software_version))


async def handle_api_versions(ctx: RequestContext, request: m.ApiVersionsRequest) -> m.ApiVersionsResponse:
    if ctx.api_version >= 3 and not valid_software(request):
        return m.ApiVersionsResponse(error_code=ErrorCode.INVALID_REQUEST, api_keys=[], throttle_time_ms=0)
    # Tagged fields that hold their defaults are not written (COMPAT-NOTES: librdkafka 2.0).
    response = m.ApiVersionsResponse(error_code=0, api_keys=ctx.services.api_versions, throttle_time_ms=0)
    levels = {TRANSACTION_VERSION: TRANSACTION_VERSION_LEVEL}
    if any(k.api_key == CONSUMER_GROUP_HEARTBEAT for k in ctx.services.api_versions):
        levels[GROUP_VERSION] = GROUP_VERSION_LEVEL
    response.supported_features = [m.SupportedFeatureKey(name=n, min_version=0, max_version=level)
                                   for n, level in sorted(levels.items())]
    response.finalized_features_epoch = FINALIZED_FEATURES_EPOCH
    response.finalized_features = [m.FinalizedFeatureKey(name=n, max_version_level=level, min_version_level=level)
                                   for n, level in sorted(levels.items())]
    return response
