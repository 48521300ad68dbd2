"""LMI bodies that are not JSON, read as DJL Serving reads them by their Content-Type.

Source: deepjavalibrary/djl-serving v0.36.0 `engines/python/setup/djl_python/encode_decode.py`
`decode`: `text/plain` is `{"inputs": [<the text>]}` (a list: the dynamic-batch schema),
`application/x-www-form-urlencoded` is `{"inputs": <the text>}` (the rolling-batch schema),
`application/json` (charset or not) is JSON. A body that is a JSON object stays JSON whatever
its Content-Type (a browser's fetch sends JSON strings as text/plain)."""

from __future__ import annotations

import orjson
import pytest

from adapters import base
from adapters.frontends import lmi
from schemas import errors


def _parse(body: bytes, ctype: str | None) -> lmi.LmiTranslator:
    headers = {} if ctype is None else {"content-type": ctype}
    c = base.RequestContext("/invocations", {}, headers, lambda _: {})
    return lmi.LmiFrontend().parse(body, c)


def test_plain_text_is_one_dynamic_batch_input() -> None:
    t = _parse(b"What is Deep Learning?", "text/plain; charset=utf-8")
    assert t.state.schema == "dynamic" and t.request.prompts == ["What is Deep Learning?"]


def test_form_encoded_text_is_a_rolling_batch_input() -> None:
    """curl -d sends this type: DJL reads the whole body as the `inputs` string."""
    t = _parse(b"What is Deep Learning?", "application/x-www-form-urlencoded")
    assert t.state.schema == "rolling" and t.request.prompts == ["What is Deep Learning?"]


@pytest.mark.parametrize("ctype", [None, "application/json", "application/json; charset=utf-8",
                                   "text/plain", "application/x-www-form-urlencoded"])
def test_a_json_object_body_is_json(ctype: str | None) -> None:
    t = _parse(orjson.dumps({"inputs": "Hi", "parameters": {"max_new_tokens": 5}}), ctype)
    assert t.state.schema == "rolling" and t.request.sampling.max_tokens == 5


def test_text_that_is_not_json_under_a_json_type_is_refused() -> None:
    with pytest.raises(errors.InvalidRequest):
        _parse(b"What is Deep Learning?", "application/json")
