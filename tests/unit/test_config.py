"""Config: defaults, unknown keys refused with their location, env overrides, references."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import cli, config


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gateway.yaml"
    p.write_text(text)
    return p


def test_every_key_has_a_default() -> None:
    cfg = config.load_config(None, {})
    assert cfg.server.port == 8080 and cfg.server.host == "0.0.0.0"
    assert cfg.server.timeouts.first_byte == 120 and cfg.server.max_concurrent_requests == 1024
    assert cfg.default_model == "demo" and cfg.workers[0].kind == "simulator"
    assert cfg.workers[0].port == 0  # a free loopback port, so two default gateways never clash


def test_spec_example_validates(tmp_path: Path) -> None:
    cfg = config.load_config(write(tmp_path, """
server: {host: 0.0.0.0, port: 8080, api_keys: [], max_request_bytes: 10485760,
         max_concurrent_requests: 1024,
         timeouts: {connect: 5, first_byte: 120, idle: 60, request_read: 30}}
default_model: llama
models:
  - name: llama
    aliases: [my-chat]
    backend: vllm
    upstreams: [http://10.0.0.5:8000, http://10.0.0.6:8000]
    upstream_model: meta-llama/Llama-3.1-8B-Instruct
    chat_template: null
    lmi: {tgi_compat: false, output_formatter: jsonlines}
elastic: {framing: documented}
workers:
  - {kind: simulator, model: llama, port: 8101}
"""), {})
    assert cfg.models[0].upstream_model == "meta-llama/Llama-3.1-8B-Instruct"
    assert cfg.models[0].aliases == ("my-chat",)


def test_unknown_keys_are_errors_with_their_location(tmp_path: Path) -> None:
    path = write(tmp_path, """
models:
  - name: a
    upstreams: [http://x:1]
  - name: b
    upstreams: [http://x:1]
    colour: blue
server: {timeouts: {idel: 3}}
""")
    with pytest.raises(config.ConfigError) as err:
        config.load_config(path, {})
    assert "models.1.colour: unknown key" in err.value.problems or \
        "models[1].colour: unknown key" in err.value.problems
    assert "server.timeouts.idel: unknown key" in err.value.problems


def test_bad_upstream_url_and_missing_model_reference(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.load_config(write(tmp_path, "models: [{name: a, upstreams: [ftp://x]}]\n"), {})
    assert any(p.startswith("models[0].upstreams") for p in err.value.problems)
    with pytest.raises(config.ConfigError) as err:
        config.load_config(write(tmp_path, "default_model: zzz\nmodels: [{name: a}]\n"), {})
    assert "default_model" in err.value.problems[0]


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "server: {port: 8000}\nmodels: [{name: a}]\n")
    cfg = config.load_config(path, {"GATEWAY_SERVER__PORT": "9000",
                                    "GATEWAY_SERVER__API_KEYS": "[k1, k2]",
                                    "GATEWAY_SERVER__TIMEOUTS__IDLE": "5", "OTHER": "x"})
    assert cfg.server.port == 9000 and cfg.server.api_keys == ("k1", "k2")
    assert cfg.server.timeouts.idle == 5


def test_environment_override_errors_name_the_key() -> None:
    with pytest.raises(config.ConfigError) as err:
        config.load_config(None, {"GATEWAY_SERVER__PORT": "not-a-port"})
    assert err.value.problems[0].startswith("server.port")


def test_check_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "models: [{name: a}]\n")
    assert cli.main(["check-config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [{name: a, backend: nope}]\nbogus: 1\n")
    assert cli.main(["check-config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "models[0].backend" in err and "bogus: unknown key" in err


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("gateway ")


def test_check_config_reads_chat_template_files(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    template = tmp_path / "llama3.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    good = write(tmp_path, f"models: [{{name: t, backend: triton, chat_template: {template}}}]\n")
    assert cli.main(["check-config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [{name: t, backend: triton, chat_template: /no/such/file.jinja}]\n")
    assert cli.main(["check-config", str(bad)]) == 1
    assert "models[0].chat_template" in capsys.readouterr().err


def test_protocol_options_are_assembled_from_the_registry(tmp_path: Path) -> None:
    """Each protocol declares its options model (registry.MODEL_OPTIONS / GATEWAY_OPTIONS);
    the config schema carries them under their keys, with their defaults and locations."""
    from adapters import registry

    cfg = config.load_config(write(tmp_path, "models: [{name: a, lmi: {tgi_compat: true}}]\n"),
                             {})
    model = cfg.models[0]
    assert set(model.protocol_options()) == set(registry.MODEL_OPTIONS)
    assert model.protocol_options()["lmi"] == registry.MODEL_OPTIONS["lmi"](tgi_compat=True)
    assert set(cfg.protocol_options()) == set(registry.GATEWAY_OPTIONS)
    with pytest.raises(config.ConfigError) as err:
        config.load_config(write(tmp_path, "models: [{name: a, backend: nope, "
                                           "lmi: {output_formatter: xml}}]\n"
                                           "workers: [{kind: gpu, model: a}]\n"), {})
    problems = "\n".join(err.value.problems)
    assert "models[0].backend: Input should be 'vllm'" in problems
    assert "models[0].lmi.output_formatter:" in problems
    assert "workers[0].kind: Input should be 'vllm', 'trtllm' or 'simulator'" in problems
