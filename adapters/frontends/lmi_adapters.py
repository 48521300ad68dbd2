"""LMI LoRA adapters: the body's `adapters` or SageMaker's adapter header name the model served.

DJL Serving takes a LoRA adapter per request (serving/docs/adapters.md; djl_python
input_parser.py `parse_adapters` / `_fetch_adapters_from_input`, for the `inputs` and `messages`
bodies; lmi_vllm/vllm_async_service.py with async_utils.py `_extract_lora_adapter`, for every
body, `prompt` included). As TGI's `adapter_id` (frontends/tgi.py), an adapter here is a model
name or alias of the gateway's config whose `upstream_model` is the LoRA's name on the worker
(vLLM serves a LoRA as a model name), so a LoRA is routed, balanced and logged as a model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas import errors

# input_parser.py SAGEMAKER_ADAPTER_IDENTIFIER_HEADER, and the alias DJL names in its error;
# lower-case, as the gateway keeps header names.
IDENTIFIER_HEADER = "x-amzn-sagemaker-adapter-identifier"
ALIAS_HEADER = "x-amzn-sagemaker-adapter-alias"


@dataclass(slots=True, frozen=True)
class Requested:
    """The adapters a request names, one per input ("" is the base model), and how DJL's
    error names them."""

    names: tuple[object, ...]  # as sent: checked with the body (`served`)
    alias: str | None = None

    @property
    def first(self) -> str | None:
        """The adapter the request is served by when it is valid; None: the base model."""
        name = self.names[0] if self.names else None
        return name if isinstance(name, str) and name else None


NONE = Requested(())


def requested(data: dict[str, Any], headers: Mapping[str, str]) -> Requested:
    """Take `adapters` out of the body (it is no field of any schema) and read the header,
    which wins over it, as both DJL readers do. A name or a list of names; `null` and `[]`
    name none (DJL: "If the adapters is not passed, the base model will be used")."""
    raw = data.pop("adapters", None)
    if IDENTIFIER_HEADER in headers:
        return Requested((headers[IDENTIFIER_HEADER],), headers.get(ALIAS_HEADER) or None)
    if raw is None:
        return NONE
    return Requested(tuple(raw) if isinstance(raw, list) else (raw,))


def served(want: Requested, inputs: int, known: Callable[[str], bool]) -> str | None:
    """The model name a valid request is served by (None: the one its route names).

    DJL `parse_adapters`: one adapter per input ("Number of adapters is not equal to the number
    of inputs"), so a dynamic batch lists one for each of its inputs; and an adapter it has not
    registered is the client's error, 424 "Adapter <alias or name> is not registered" (both
    DJL modes answer it 424, as a parse failure: the LMI client's form for a bad request, where
    a 404 would say the endpoint's model is missing). The gateway sends a batch to one model,
    so the inputs of a batch must name the same adapter."""
    if not want.names:
        return None
    if not all(isinstance(n, str) for n in want.names):
        raise errors.InvalidRequest("`adapters` must be an adapter name or a list of them",
                                    field="adapters")
    if len(want.names) != inputs:
        raise errors.InvalidRequest("Number of adapters is not equal to the number of inputs",
                                    field="adapters")
    if len(set(want.names)) > 1:
        raise errors.Unsupported(
            "`adapters` must name one adapter for every input of a batch: the gateway sends a "
            "batch to one model (send the inputs of each adapter as a batch of their own)",
            field="adapters")
    name = want.first
    if name is not None and not known(name):
        raise errors.InvalidRequest(f"Adapter {want.alias or name} is not registered",
                                    field="adapters")
    return name
