"""ApiVersions (key 18): the versions of every API this broker serves (seed 003, "ApiVersions API")."""

from __future__ import annotations

from odradek.protocol.messages import APIS, api_versions as m


# Versions Apache Kafka marks unstable (latestVersionUnstable) are declared but not advertised.
UNSTABLE_LATEST = {22: 6}  # InitProducerId v6: two-phase commit (KIP-939)


def supported(handlers: dict) -> list[m.ApiVersion]:
    out = []
    for k in sorted(handlers):
        top = APIS[k].MAX_VERSION
        if UNSTABLE_LATEST.get(k) == top:
            top -= 1
        out.append(m.ApiVersion(api_key=k, min_version=APIS[k].MIN_VERSION, max_version=top))
    return out


async def handle_api_versions(ctx, request: m.ApiVersionsRequest) -> m.ApiVersionsResponse:
    # Tagged fields keep their defaults so they are not written (COMPAT-NOTES: librdkafka 2.0).
    return m.ApiVersionsResponse(error_code=0, api_keys=ctx.broker.api_versions, throttle_time_ms=0)
