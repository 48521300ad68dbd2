"""Config: defaults, unknown keys refused with their location, env overrides, references."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

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


def test_a_minimal_file_gets_the_spec_defaults(tmp_path: Path) -> None:
    """SPEC.md, Configuration: every key has a default, those of its stable subset as shown
    there (upstream_model defaults to the name: None here, the name upstream)."""
    cfg = config.load_config(write(tmp_path, "models: [{name: m}]\n"), {})
    s = cfg.server
    assert (s.host, s.port, s.api_keys, s.max_request_bytes, s.max_concurrent_requests) == (
        "0.0.0.0", 8080, (), 10485760, 1024)
    assert (s.timeouts.connect, s.timeouts.first_byte, s.timeouts.idle,
            s.timeouts.request_read) == (5, 120, 60, 30)
    (m,) = cfg.models
    assert (m.aliases, m.backend, m.upstreams, m.upstream_model, m.chat_template) == (
        (), "vllm", (), None, None)
    assert (m.lmi.tgi_compat, m.lmi.output_formatter) == (False, "jsonlines")
    assert cfg.elastic.framing == "documented" and cfg.workers == ()
    assert cfg.default_model is None  # routes that name no model take the only one


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


def test_keep_alive_outlasts_the_common_proxies_idle_timeouts() -> None:
    """`timeouts.keep_alive` defaults above the 60 s that an AWS ALB and ingress-nginx keep
    idle connections to their targets (the wire test shows the server keeping one); it can be
    raised for Google's load balancers (600 s) and must be positive."""
    assert config.load_config(None, {}).server.timeouts.keep_alive == 75
    cfg = config.load_config(None, {"GATEWAY_SERVER__TIMEOUTS__KEEP_ALIVE": "620"})
    assert cfg.server.timeouts.keep_alive == 620
    with pytest.raises(config.ConfigError) as err:
        config.load_config(None, {"GATEWAY_SERVER__TIMEOUTS__KEEP_ALIVE": "0"})
    assert err.value.problems[0].startswith("server.timeouts.keep_alive")


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
    said = capsys.readouterr().out
    assert said.startswith("gateway ")
    # which build runs: `pip install .` falls back to pure Python quietly where it cannot compile
    from gateway import http1
    assert said.strip().endswith("(compiled)" if http1.__file__.endswith(".so") else "(pure)")


@pytest.mark.parametrize("command", [[], ["serve"], ["check-config"], ["simulate"]],
                         ids=["gateway", "serve", "check-config", "simulate"])
def test_help_on_every_command(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """SPEC.md, Command line: `--help` on every command (exit 0, its usage on stdout)."""
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {' '.join(['gateway', *command])} ")


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


TEN_MISTAKES = """\
server:
  port: 70000                       # 1 out of range
  colour: red                       # 2 unknown key
  timeouts: {idle: -1}              # 3 not positive
default_model: nowhere              # 4 no such model
models:
  - name: a
    backend: nope                   # 5 unknown protocol
    upstreams: [ftp://x,            # 6 scheme
                "http://:80",       # 7 no host
                "http://w:99999"]   # 8 port
  - name: b
    aliases: [a]                    # 9 alias collides with a name
workers:
  - {kind: simulator, model: a, port: 9000}
  - {kind: simulator, model: b, port: 9000} # 10 a port taken twice
"""


def test_check_config_reports_ten_mistakes_in_one_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in __import__("os").environ if k.startswith("GATEWAY_")]:
        monkeypatch.delenv(key)
    bad = tmp_path / "bad.yaml"
    bad.write_text(TEN_MISTAKES)
    assert cli.main(["check-config", str(bad)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert sorted(line.removeprefix(f"{bad}: ").split(":")[0] for line in lines) == sorted([
        "server.port", "server.colour", "server.timeouts.idle", "default_model",
        "models[0].backend", "models[0].upstreams[0]", "models[0].upstreams[1]",
        "models[0].upstreams[2]", "models[1]", "workers[1].port"])
    assert all(line.startswith(f"{bad}: ") and line.count(str(bad)) == 1 for line in lines)


@pytest.mark.parametrize("url", ["http://h", "https://h:1", "http://10.0.0.5:65535/v1-proxy",
                                 "http://[::1]:8000", "http://u:p@h:8000/openai"])
def test_good_upstream_urls(url: str) -> None:
    cfg = config.ModelConfig.model_validate({"name": "a", "upstreams": [url + "/"]})
    assert cfg.upstreams == (url,)


@pytest.mark.parametrize("url", ["http://h:8000/v1", "http://h:8000/v1/",
                                 "https://api.example.com/openai/v1"])
def test_a_base_url_written_with_v1_as_openai_clients_write_it_is_its_root(url: str) -> None:
    """The backends append versioned routes (`/v1/chat/completions`, `/v1/models`); vLLM's
    docs (docs/serving/openai_compatible_server.md) give the server's base URL as
    `http://localhost:8000/v1`, the openai SDK's `base_url` form, and a base written so was
    sent `/v1/v1/chat/completions`: a 404 for every request and health probe."""
    cfg = config.ModelConfig.model_validate({"name": "a", "upstreams": [url]})
    assert cfg.upstreams == (url.rstrip("/").removesuffix("/v1"),)


@pytest.mark.parametrize(("url", "why"), [
    ("ftp://h", "must start with http:// or https://"), ("h:8000", "must start with"),
    ("http://", "names no host"), ("http://h:0", "1-65535"), ("http://h:65536", "1-65535"),
    ("http://h:port", "1-65535"), ("http://h:", "1-65535")])
def test_bad_upstream_urls(url: str, why: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.load_config(None, {"GATEWAY_MODELS__0__UPSTREAMS": f"[{url!r}]"})
    (problem,) = err.value.problems
    assert problem.startswith("models[0].upstreams[0]: ") and why in problem
    assert problem.endswith("(set by GATEWAY_MODELS__0__UPSTREAMS)")


def test_yaml_errors_name_the_file_once_with_line_and_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("server:\n  port: [1, 2\nmodels: []\n")
    assert cli.main(["check-config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}: line ") and "not valid YAML" in err
    assert err.count(str(bad)) == 1 and "<unicode string>" not in err
    assert cli.main(["check-config", str(tmp_path / "missing.yaml")]) == 1
    err = capsys.readouterr().err
    assert err == f"{tmp_path / 'missing.yaml'}: No such file or directory\n"


def test_a_model_nothing_serves_is_a_warning(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "models: [{name: lonely}, {name: fed, upstreams: [http://w:1]}]\n")
    assert cli.main(["check-config", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: models[0]: model 'lonely' has no upstreams and no worker" in err
    assert "fed" not in err


def test_stray_gateway_variables_are_warnings_naming_them() -> None:
    warnings: list[str] = []
    env = {"GATEWAY_FOO": "1", "GATEWAY_SERVER_PORT": "1", "GATEWAY_SERVER__PORT__X": "1",
           "GATEWAY_MODELS__5__NAME": "x", "GATEWAY_": "", "GATEWAY_SERVER__PORT": "9000"}
    cfg = config.load_config(None, env, warnings)
    assert cfg.server.port == 9000
    assert sorted(w.split(":", 1)[0] for w in warnings) == sorted(set(env) - {
        "GATEWAY_SERVER__PORT"})


def test_overrides_reach_list_entries_and_keep_text_as_text(tmp_path: Path) -> None:
    path = write(tmp_path, "models: [{name: a, upstreams: [http://w:1]}]\n")
    cfg = config.load_config(path, {"GATEWAY_MODELS__0__UPSTREAM_MODEL": "0123",
                                    "GATEWAY_MODELS__0__LMI__TGI_COMPAT": "true",
                                    "GATEWAY_SERVER__API_KEYS": "[0123]",
                                    "GATEWAY_DEFAULT_MODEL": "a"})
    assert cfg.models[0].upstream_model == "0123" and cfg.default_model == "a"
    assert cfg.models[0].lmi.tgi_compat is True
    assert cfg.server.api_keys == ("0123",)


def test_an_assembled_config_pickles() -> None:
    """The schema classes are made at import (create_model) but named as their module
    attributes, so a config crosses a process boundary as itself."""
    import pickle

    cfg = config.load_config(None, {})
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_the_readmes_config_sample_is_valid(tmp_path: Path) -> None:
    """The README's annotated config names every documented key; it must load as written."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("```yaml\nserver:") + len("```yaml\n")
    sample = write(tmp_path, readme[start:readme.index("```", start)])
    cfg = config.load_config(sample, {})
    assert cfg.models[0].name == "llama" and cfg.server.failover_attempts == 1


def _keys(model: type[BaseModel]) -> set[str]:
    """Every key of a config section and of the sections below it."""
    found = set(model.model_fields)
    for field in model.model_fields.values():
        kinds = [field.annotation, *typing.get_args(field.annotation)]
        for kind in kinds:
            for inner in (kind, *typing.get_args(kind)):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    found |= _keys(inner)
    return found


def test_the_readmes_config_sample_names_every_key() -> None:
    """A user learns the settings from the README's annotated config: each key the schema
    takes (server.drain_seconds was missing) is there, as a key or in a comment."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("```yaml\nserver:") + len("```yaml\n")
    sample = readme[start:readme.index("```", start)]
    missing = sorted(k for k in _keys(config.Config) if not re.search(rf"\b{k}\b", sample))
    assert missing == []


def test_check_config_reports_unreadable_files_with_the_schemas_problems(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat_template file and a tokenizer that cannot be read are reported in the same run
    as a schema mistake, and two bad files are two problems, not the first only."""
    for key in [k for k in __import__("os").environ if k.startswith("GATEWAY_")]:
        monkeypatch.delenv(key)
    bad = tmp_path / "files.yaml"
    bad.write_text(f"server: {{port: -1}}\nmodels:\n"
                   f"  - {{name: a, backend: triton, chat_template: {tmp_path}/none.jinja}}\n"
                   f"  - {{name: b, tokenizer: {tmp_path}/no-such-dir}}\n")
    assert cli.main(["check-config", str(bad)]) == 1
    where = sorted(line.removeprefix(f"{bad}: ").split(":")[0]
                   for line in capsys.readouterr().err.splitlines())
    assert where == ["models[0].chat_template", "models[1].tokenizer", "server.port"]
    good = tmp_path / "files-only.yaml"
    good.write_text(f"models:\n  - {{name: a, backend: triton, chat_template: {tmp_path}/x.j2}}\n"
                    f"  - {{name: b, tokenizer: {tmp_path}/none}}\n")
    assert cli.main(["check-config", str(good)]) == 1
    errors = [e for e in capsys.readouterr().err.splitlines() if ": warning: " not in e]
    assert [e.removeprefix(f"{good}: ").split(":")[0] for e in errors] == [
        "models[0].chat_template", "models[1].tokenizer"]


UP = "upstreams: ['http://w:1']"
# (config text, the start of its one problem): each started a gateway that meant something else
MISTAKES = [
    # PyYAML keeps the last of two equal keys: the first `server:` section vanished silently
    ("server: {port: 1}\nserver: {max_request_bytes: 5}\nmodels: [{name: a}]\n",
     "line 2, column 1: not valid YAML: duplicate key 'server'"),
    (f"models: [{{name: a, {UP}, backend: vllm, backend: tgi}}]\n", "line 1, column "),
    # the worker's route is appended to the base URL: after a query it is no route at all
    ("models: [{name: a, upstreams: ['http://w:1/v1?key=x']}]\n",
     "models[0].upstreams[0]: 'http://w:1/v1?key=x': a base URL takes no query"),
    ("models: [{name: a, upstreams: ['http://w:1#top']}]\n", "models[0].upstreams[0]:"),
    # a second worker on one port never listens, and is restarted forever
    ("models: [{name: a}]\nworkers: [{kind: simulator, model: a, port: 18777},"
     " {kind: simulator, model: a, port: 18777}]\n",
     "workers[1].port: 18777 is already used by workers[0]"),
    # pydantic's lax mode takes YAML's `yes` as 1: one request at a time
    (f"server: {{max_concurrent_requests: yes}}\nmodels: [{{name: a, {UP}}}]\n",
     "server.max_concurrent_requests: a number is required, not the YAML boolean true"),
    (f"server: {{port: true}}\nmodels: [{{name: a, {UP}}}]\n", "server.port: a number"),
    (f"server: {{timeouts: {{idle: off}}}}\nmodels: [{{name: a, {UP}}}]\n",
     "server.timeouts.idle: a number is required, not the YAML boolean false"),
    (f"server: {{workers: 0}}\nmodels: [{{name: a, {UP}}}]\n",
     "server.workers: must be a whole number of at least 1, or auto"),
    # Jinja2 that does not parse: every chat request to the model was a 500
    (f"models: [{{name: a, {UP}, backend: triton, chat_template: '{{% for %}}'}}]\n",
     "models[0].chat_template: the model's `chat_template` is not a valid Jinja2 template"),
]


@pytest.mark.parametrize(("text", "problem"), MISTAKES,
                         ids=["dup-section", "dup-key", "query", "fragment",
                              "worker-port", "yes-as-1", "true-port", "off-timeout",
                              "workers-0", "bad-jinja"])
def test_a_config_that_would_mean_something_else_is_one_error_naming_its_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str) -> None:
    """One line per problem, naming the key (SPEC.md: unknown keys are errors with their
    location; `gateway check-config` prints each error with its location)."""
    path = write(tmp_path, text)
    assert cli.main(["check-config", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}: {problem}"), lines[0]


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    """YAML's merge type (`<<`) lets a mapping override what it merges: not a duplicate."""
    path = write(tmp_path, "models:\n  - &m {name: a, upstreams: ['http://w:1']}\n"
                           "  - <<: *m\n    name: b\n")
    assert [m.name for m in config.load_config(path, {}).models] == ["a", "b"]


def test_tracing_on_and_off_are_the_words_not_yaml_booleans(tmp_path: Path) -> None:
    """PyYAML (YAML 1.1) reads a bare `on` as true: `tracing: on` was refused with "Input
    should be 'auto', 'on' or 'off'" though the file says on."""
    for word in ("on", "off"):
        path = write(tmp_path, f"server: {{tracing: {word}}}\n")
        assert config.load_config(path, {}).server.tracing == word


def test_an_upstream_listed_twice_is_taken_once() -> None:
    """One worker, one balancer slot and one health record: a config that repeats it (to
    weight it, as nginx's upstream block would) still starts."""
    cfg = config.Config.model_validate(
        {"models": [{"name": "a", "upstreams": ["http://w:1", "http://w:2", "http://w:1"]}]})
    assert cfg.models[0].upstreams == ("http://w:1", "http://w:2")


# SPEC.md's sample config, as written there: `demo` is named only by `default_model` and a
# worker, as in the embedded default.
SPEC_SAMPLE = """
server:
  host: 0.0.0.0
  port: 8080
  api_keys: []
  max_request_bytes: 10485760
  max_concurrent_requests: 1024
  timeouts:
    connect: 5
    first_byte: 120
    idle: 60
    request_read: 30
default_model: demo
models:
  - name: llama
    aliases: [my-chat]
    backend: vllm
    upstreams: [http://10.0.0.5:8000, http://10.0.0.6:8000]
    upstream_model: meta-llama/Llama-3.1-8B-Instruct
    chat_template: null
    lmi:
      tgi_compat: false
      output_formatter: jsonlines
elastic:
  framing: documented
workers:
  - kind: simulator
    model: demo
    port: 8101
"""


@pytest.mark.parametrize(("text", "declared"), [
    (SPEC_SAMPLE, [("llama", "vllm"), ("demo", "vllm")]),
    ("default_model: demo\nworkers: [{kind: simulator, model: demo}]\n", [("demo", "vllm")]),
    ("workers: [{kind: trtllm, model: t}, {kind: vllm, model: t, port: 9}]\n",
     [("t", "trtllm")]),
    ("models: [{name: a, aliases: [b]}]\nworkers: [{kind: vllm, model: b}]\n", [("a", "vllm")]),
], ids=["spec-sample", "workers-only", "two-workers-one-model", "alias"])
def test_a_model_only_workers_name_is_declared_by_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
        declared: list[tuple[str, str]]) -> None:
    """SPEC.md's own sample config must load: its `default_model` and worker name `demo`,
    which `models` does not list; the workers declare it, with their kind's protocol (the
    simulator's is vllm), and check-config says so as a warning."""
    path = write(tmp_path, text)
    cfg = config.load_config(path, {})
    assert [(m.name, m.backend) for m in cfg.models] == declared
    assert cli.main(["check-config", str(path)]) == 0
    out = capsys.readouterr()
    assert out.out == f"{path}: ok\n"
    implied = [n for n, _ in declared if f"model {n!r} is not in `models`" in out.err]
    assert implied == [n for n, _ in declared if n not in ("llama", "a")]


@pytest.mark.parametrize(("value", "keys"), [
    ("k1", ("k1",)), ("0123", ("0123",)), ("[k1, k2]", ("k1", "k2")), ('["k1"]', ("k1",)),
    ("sk-proj_AbC.9", ("sk-proj_AbC.9",))])
def test_one_bare_key_from_the_environment_is_the_list_of_that_key(
        value: str, keys: tuple[str, ...]) -> None:
    """SPEC.md: environment variables override the file "so that a Kubernetes manifest needs
    no config rewrite for ports and keys": a Secret holding one key is set as it is
    (`GATEWAY_SERVER__API_KEYS=k1`), as well as a YAML or JSON list."""
    cfg = config.load_config(None, {"GATEWAY_SERVER__API_KEYS": value,
                                    "GATEWAY_MODELS__0__ALIASES": "chat"})
    assert cfg.server.api_keys == keys and cfg.models[0].aliases == ("chat",)


@pytest.mark.parametrize(("yaml_text", "args", "env", "gpus"), [
    ("args: [--tokens, 8, --gpu-memory-utilization, 0.9]", ("--tokens", "8",
                                                             "--gpu-memory-utilization", "0.9"),
     {}, None),
    ("env: {OMP_NUM_THREADS: 4, HF_HOME: /m}", (), {"OMP_NUM_THREADS": "4", "HF_HOME": "/m"},
     None),
    ("gpus: 0", (), {}, "0"),
    ("gpus: [0, 1]", (), {}, "0,1"),
    ("gpus: '2,3'", (), {}, "2,3"),
], ids=["args", "env", "gpus-int", "gpus-list", "gpus-text"])
def test_a_workers_args_env_and_gpus_take_yaml_numbers_as_written(
        tmp_path: Path, yaml_text: str, args: tuple[str, ...], env: dict[str, str],
        gpus: str | None) -> None:
    """SPEC.md (Workers the gateway manages): an entry's args, env and GPUs reach its process.
    YAML reads `[--tokens, 8]`, `{OMP_NUM_THREADS: 4}` and `gpus: 0` as numbers; they were
    refused ("Input should be a valid string") though they mean the text written."""
    text = f"models: [{{name: demo}}]\nworkers:\n  - kind: simulator\n    model: demo\n" \
           f"    {yaml_text}\n"
    cfg = config.load_config(write(tmp_path, text), {})
    w = cfg.workers[0]
    assert (w.args, w.env, w.gpus) == (args, env, gpus)


def test_a_yaml_boolean_in_a_workers_env_is_still_refused(tmp_path: Path) -> None:
    """`yes` may mean "yes" or "true": the file must say which, as text."""
    path = write(tmp_path, "models: [{name: demo}]\nworkers:\n"
                           "  - {kind: simulator, model: demo, env: {X: yes}}\n")
    with pytest.raises(config.ConfigError, match=r"workers\[0\]\.env\.X"):
        config.load_config(path, {})


@pytest.mark.parametrize(("value", "keys"), [
    ("k1", ("k1",)),
    ("k1,k2", ("k1", "k2")),
    ("k1, k2", ("k1", "k2")),
    ("0123", ("0123",)),
    ("!k#1", ("!k#1",)),
    ("[k1, k2]", ("k1", "k2")),
    ("- k1\n- k2", ("k1", "k2")),
])
def test_api_keys_from_the_environment_as_a_manifest_gives_them(value: str,
                                                                keys: tuple[str, ...]) -> None:
    """SPEC.md (Configuration): environment variables override the file "so that a Kubernetes
    manifest needs no config rewrite for ports and keys". A Secret holds one key, or several
    joined by commas: `GATEWAY_SERVER__API_KEYS=k1` was refused ("Input should be a valid
    tuple"), so the gateway did not start."""
    cfg = config.load_config(None, {"GATEWAY_SERVER__API_KEYS": value})
    assert cfg.server.api_keys == keys


def test_a_list_of_upstreams_from_the_environment_may_be_comma_separated() -> None:
    cfg = config.load_config(None, {"GATEWAY_MODELS__0__UPSTREAMS": "http://a:1,http://b:2"})
    assert cfg.models[0].upstreams == ("http://a:1", "http://b:2")


@pytest.mark.parametrize("value", ["", " ", ","])
def test_an_empty_api_keys_variable_is_an_error_never_an_open_gateway(value: str) -> None:
    """A Secret that lost its key sets the variable empty: read as no keys, every route would
    be open; it is a config error naming the variable instead."""
    with pytest.raises(config.ConfigError) as err:
        config.load_config(None, {"GATEWAY_SERVER__API_KEYS": value})
    assert err.value.problems == ["server.api_keys: the variable is empty: give a value, or "
                                  "unset it for the default (set by GATEWAY_SERVER__API_KEYS)"]


@pytest.mark.parametrize("name", ["GATEWAY_SERVER__PORT", "GATEWAY_SERVER__TIMEOUTS__IDLE",
                                  "GATEWAY_MODELS__0__UPSTREAMS"])
def test_an_empty_variable_is_named_as_empty(name: str) -> None:
    """`GATEWAY_SERVER__PORT=` read as pydantic's "unable to parse string as an integer" or
    "Input should be a valid tuple": the operator is told the variable is empty instead."""
    with pytest.raises(config.ConfigError) as err:
        config.load_config(None, {name: ""})
    (problem,) = err.value.problems
    assert "the variable is empty: give a value, or unset it for the default" in problem
    assert problem.endswith(f"(set by {name})")


def test_a_managed_worker_gets_time_to_load_a_large_model(tmp_path: Path) -> None:
    """A `workers:` entry written with SPEC.md's keys only: vLLM binds its port before the
    engine loads but listens only after (vllm/entrypoints/openai/api_server.py
    `setup_server`, then the engine, then `serve_http`), so for the 5 to 15 minutes a large
    model loads its /health is refused. The default `startup_timeout` was 600 s: such a
    worker was killed as it loaded, and each restart began the load again."""
    path = write(tmp_path, "workers: [{kind: vllm, model: llama, port: 8001}]\n")
    worker = config.load_config(path, {}).workers[0]
    assert worker.startup_timeout >= 15 * 60
    assert worker.restart == "always"


def test_a_variable_in_lower_case_applies_as_in_upper_case() -> None:
    """Names are read without regard to case, as pydantic-settings does by default
    (`case_sensitive=False`): `gateway_server__port=9000` was ignored without a word."""
    assert config.load_config(None, {"gateway_server__port": "9000"}).server.port == 9000
    with pytest.raises(config.ConfigError) as err:
        config.load_config(None, {"Gateway_Server__Port": "x"})
    assert err.value.problems[0].endswith("(set by Gateway_Server__Port)")
