"""`pip install .` compiles the modules every request and every streamed chunk runs through
with mypyc where the machine has a C compiler (bench/RESULTS.md §21: about a quarter fewer
instructions a chunk), and installs them as pure Python where it cannot
(build_support/compile_choice.py: `GATEWAY_COMPILE=0` pure, `1` compiled or fail). The .py
files ship either way; a compiled module, where present, is the one imported.
build_support/gateway_build.py adds mypy and the dependencies to the build environment."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_support import compile_choice  # noqa: E402 - found beside this file

# Hot path only, and only modules that mypyc compiles without a change of behaviour: none
# with async generators (gateway.failover, gateway.pipeline), and no class whose uncompiled
# subclasses set class attributes its compiled methods read as instance defaults. The
# decoders and the OpenAI API backends (OpenAI, vLLM, trtllm-serve) are compiled with every
# subclass, their settings declared `ClassVar` (read from the instance's class). No
# coroutine here waits while it handles an exception (tests/integration/test_compiled_build.py).
# No class here aliases a method by assignment (`inc = observe`): compiled, that is an unset
# attribute. A compiled module calls another's functions directly, so replacing one (a test's
# monkeypatch) reaches interpreted callers only. gateway.held reads prometheus_client's
# objects by attribute name, which compiled code does as generically as the interpreter.
# The whole suite passed against this build (bench/RESULTS.md §22, §33).
COMPILED = [
    "adapters/framing.py",
    "adapters/backends/checked.py",
    "adapters/backends/decoder.py",
    "adapters/backends/openai.py",
    "adapters/backends/openai_decode.py",
    "adapters/backends/params.py",
    "adapters/backends/text_slot.py",
    "adapters/backends/tgi_decode.py",
    "adapters/backends/trtllm.py",
    "adapters/backends/triton_decode.py",
    "adapters/backends/vllm.py",
    "adapters/frontends/elastic_encode.py",
    "adapters/frontends/lmi_encode.py",
    "adapters/frontends/openai_encode.py",
    "adapters/frontends/openai_parse.py",
    "adapters/frontends/tgi_encode.py",
    "adapters/validation.py",
    "gateway/admission.py",
    "gateway/balancer.py",
    "gateway/deadline.py",
    "gateway/exchange.py",
    "gateway/held.py",
    "gateway/http1.py",
    "gateway/http_cycle.py",
    "gateway/http_server.py",
    "gateway/metrics.py",
    "gateway/observability.py",
    "gateway/progress.py",
    "gateway/pump.py",
    "gateway/serving.py",
    "gateway/telemetry.py",
    "gateway/whole.py",
    "gateway/write_batch.py",
    "schemas/events.py",
]

# Only when building a wheel or extensions: setuptools also runs this file to learn the build
# requirements and the metadata (`egg_info`), before the backend has installed mypy.
ext_modules = compile_choice.extensions(COMPILED) if compile_choice.builds_binaries(sys.argv) else []

setup(ext_modules=ext_modules, cmdclass={"build_ext": compile_choice.OptionalBuildExt})
