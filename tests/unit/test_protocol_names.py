"""gateway/ names no protocol: what a client or worker protocol means lives in adapters/ (its
own module, and adapters/registry.py which maps names to them), so adding a protocol never
touches the gateway's core (STYLE.md section 3; issue: architecture)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = re.compile(
    r"(?<![a-z])(openai|tgi|lmi|sagemaker|elastic|elasticsearch|vllm|trtllm|tensorrt|triton)"
    r"(?![a-z])", re.IGNORECASE)


def code_tokens(path: Path) -> list[tuple[int, str]]:
    """Names and string literals of a module, docstrings and comments left out."""
    out: list[tuple[int, str]] = []
    prev = tokenize.NEWLINE
    toks = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    for tok in toks:
        if tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT,
                                                     tokenize.DEDENT, tokenize.NL):
            prev = tok.type
            continue  # a docstring (a statement that is only a string)
        if tok.type in (tokenize.NAME, tokenize.STRING):  # 3.11: an f-string is one STRING
            out.append((tok.start[0], tok.string))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type
    return out


def test_gateway_names_no_protocol() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {text}"
             for path in sorted((ROOT / "gateway").rglob("*.py"))
             for line, text in code_tokens(path) if PROTOCOLS.search(text)]
    assert found == []


def test_the_check_sees_a_protocol_name(tmp_path: Path) -> None:
    """The scan is not vacuous: code naming a protocol is found, its docstring is not."""
    module = tmp_path / "m.py"
    module.write_text('"""Speaks vLLM."""\nif backend == "tgi":\n    pass\n')
    assert [t for _, t in code_tokens(module) if PROTOCOLS.search(t)] == ['"tgi"']
