"""Pure Python by default; `GATEWAY_COMPILE=1 pip install .` also compiles the modules every
request and every streamed chunk runs through with mypyc (bench/RESULTS.md §21: about a
quarter fewer instructions a chunk). The .py files ship either way; a compiled module, where
present, is the one imported. Needs a C compiler; build_support/gateway_build.py adds mypy and
the dependencies to the build environment."""

from __future__ import annotations

import os
import sys

from setuptools import setup

# Hot path only, and only modules that mypyc compiles without a change of behaviour: none
# with async generators (gateway.failover, gateway.pipeline), none that reads another
# library's objects by introspection (gateway.held), and no class whose uncompiled
# subclasses set class attributes its compiled methods read as instance defaults (the
# backends: `PER_TOKEN_LOGPROBS` and the like). The decoders are compiled with every
# subclass, their settings declared `ClassVar` (read from the instance's class). No
# coroutine here waits while it handles an exception (tests/integration/test_compiled_build.py).
# The whole suite passed against this build (bench/RESULTS.md §22).
COMPILED = [
    "adapters/framing.py",
    "adapters/backends/checked.py",
    "adapters/backends/decoder.py",
    "adapters/backends/openai_decode.py",
    "adapters/backends/params.py",
    "adapters/backends/tgi_decode.py",
    "adapters/backends/triton_decode.py",
    "adapters/frontends/elastic_encode.py",
    "adapters/frontends/lmi_encode.py",
    "adapters/frontends/openai_encode.py",
    "adapters/frontends/tgi_encode.py",
    "gateway/admission.py",
    "gateway/balancer.py",
    "gateway/deadline.py",
    "gateway/http1.py",
    "gateway/http_cycle.py",
    "gateway/http_server.py",
    "gateway/metrics.py",
    "gateway/progress.py",
    "gateway/pump.py",
    "gateway/serving.py",
    "gateway/telemetry.py",
    "gateway/whole.py",
    "schemas/events.py",
]

ext_modules = []
# Only when building: setuptools also runs this file to learn the build requirements and the
# metadata (`egg_info`), before the backend has installed mypy for the first.
if os.environ.get("GATEWAY_COMPILE", "") == "1" and {"bdist_wheel", "build_ext"} & set(sys.argv):
    from mypyc.build import mypycify

    # GATEWAY_COMPILE_SEPARATE=1: a shared library per module, which `build_ext -j N` compiles
    # side by side (the tests' quick build); else one for all, whose calls between modules
    # are direct (what the image ships).
    ext_modules = mypycify(COMPILED, opt_level=os.environ.get("GATEWAY_COMPILE_OPT", "3"),
                           separate=os.environ.get("GATEWAY_COMPILE_SEPARATE", "") == "1")

setup(ext_modules=ext_modules)
