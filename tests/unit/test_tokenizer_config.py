"""`models[].tokenizer`: read once at startup (check-config too), a file or a model directory;
managed vLLM / TensorRT-LLM workers' local model directories by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import cli, config, routing
from tests.fakes import vocab


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return path


def router(tmp_path: Path, text: str) -> routing.Router:
    return routing.Router(config.load_config(write(tmp_path, text), {}))


def test_a_tokenizer_file_or_model_directory(tmp_path: Path) -> None:
    path = vocab.build(tmp_path / "model")
    for value in (path, path.parent):
        route = router(tmp_path, f"models: [{{name: m, backend: openai, tokenizer: {value}}}]\n"
                       ).routes["m"]
        assert route.vocab is not None and route.vocab.split(" the") == [(1000, " the")]
        assert route.options["tokenizer"] is True
        assert route.options["special_token_ids"] == frozenset({1, 2})
    plain = router(tmp_path, "models: [{name: m, backend: openai}]\n").routes["m"]
    assert plain.vocab is None and plain.options["special_token_ids"] == frozenset()


def test_check_config_names_an_unreadable_tokenizer(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, f"models: [{{name: m, tokenizer: {vocab.build(tmp_path / 'x')}}}]\n")
    assert cli.main(["check-config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"models: [{{name: m, tokenizer: {tmp_path / 'nope'}}}]\n")
    assert cli.main(["check-config", str(bad)]) == 1
    assert "models[0].tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize(("kind", "found"), [("vllm", True), ("trtllm", True),
                                             ("simulator", False)])
def test_managed_workers_default_to_their_model_directory(tmp_path: Path, kind: str,
                                                          found: bool) -> None:
    model_dir = vocab.build(tmp_path / "llama").parent
    route = router(tmp_path, f"models: [{{name: m, upstream_model: {model_dir}}}]\n"
                   f"workers: [{{kind: {kind}, model: m}}]\n").routes["m"]
    assert (route.vocab is not None) is found


def test_a_hub_id_is_no_local_directory(tmp_path: Path) -> None:
    route = router(tmp_path, "models: [{name: m, upstream_model: org/llama}]\n"
                   "workers: [{kind: vllm, model: m}]\n").routes["m"]
    assert route.vocab is None
