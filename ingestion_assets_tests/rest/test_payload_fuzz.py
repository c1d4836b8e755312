"""Whatever an API answers (any JSON, any bytes, on any page), a read ends with pages or a clean ApiError."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingestion_assets.sources.rest import BucketRegistry, EndpointSpec, PaginationSpec, RestClient, read_pages
from ingestion_assets.sources.rest.errors import ApiError
from ingestion_assets_tests.rest.helpers import FAST_RETRY

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)
record = st.fixed_dictionaries(
    {"id": st.one_of(st.integers(), st.text(max_size=6), json_values), "updated_at": json_values},
    optional={"extra": json_values},
)
bodies = st.one_of(
    json_values.map(json.dumps),
    st.fixed_dictionaries(
        {"data": st.one_of(st.lists(record, max_size=4), json_values), "next_cursor": st.one_of(st.none(), scalars)}
    ).map(json.dumps),
    st.binary(max_size=80),
)
styles = st.sampled_from(["cursor", "link", "page", "offset", "single"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pages=st.lists(bodies, min_size=1, max_size=4), style=styles, link=st.one_of(st.none(), st.text(max_size=40)))
def test_any_answer_reads_or_fails_cleanly(pages: list[Any], style: str, link: str | None) -> None:
    answers = iter(pages)

    def handle(request: httpx.Request) -> httpx.Response:
        body = next(answers, b'{"data": []}')
        headers = {"Link": link.encode()} if link is not None else {}  # any bytes a server may send
        return httpx.Response(200, content=body if isinstance(body, bytes) else body.encode(), headers=headers)

    endpoint = EndpointSpec("/v1/things", pagination=PaginationSpec(style=style), page_size=2)
    client = RestClient(
        "http://api.invalid",
        retry=FAST_RETRY,
        transport=httpx.MockTransport(handle),
        buckets=BucketRegistry(),
        rate=1e6,
    )
    try:
        for index, _page in enumerate(read_pages(client, endpoint, None)):
            if index > 20:
                break  # an answer that pages for ever is the paginator's loop check's business, not this test's
    except ApiError:
        pass
    finally:
        client.close()
