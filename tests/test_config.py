"""Settings: one frozen Config, nested by concern, from flags and LENSAPP_* variables; the README's table is
generated from the same declarations."""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path

import pytest

from lensapp import cli, config, settings
from lensapp.config import Config, ConfigError

HOSTING = Path(__file__).resolve().parents[1] / "docs" / "hosting.md"


def test_the_hosting_guide_lists_every_setting_as_config_defines_it():
    assert config.settings_table() in HOSTING.read_text()


def test_flags_win_over_variables_which_win_over_defaults():
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    env = {"LENSAPP_MAX_BATCH": "4", "LENSAPP_RATE_LIMIT": "7", "GRADIO_SERVER_PORT": "8080"}
    cfg = config.from_args(parser.parse_args(["--max-batch", "2"]), env)
    assert (cfg.limits.max_batch, cfg.limits.rate_limit, cfg.web.port, cfg.limits.queue_size) == \
        (2, 7, 8080, settings.LimitSettings().queue_size)


@pytest.mark.parametrize("env, message", [
    ({"LENSAPP_MAX_BATCH": "many"}, "LENSAPP_MAX_BATCH"),
    ({"LENSAPP_BACKEND": "tpu"}, "backend must be one of"),
    ({"LENSAPP_REQUEST_TIMEOUT": "0"}, "request_timeout"),
    ({"LENSAPP_AUTH": "alice"}, "auth must be user:password"),
    ({"LENSAPP_MAX_MODEL_LEN": "100"}, "must fit max_model_len"),
    ({"LENSAPP_DISTRIBUTED_EXECUTOR_BACKEND": "slurm"}, "distributed_executor_backend"),
])
def test_bad_settings_name_themselves(env, message):
    with pytest.raises(ConfigError, match=message):
        config.from_args(None, env)


def test_auth_pairs_and_a_space_cache():
    assert Config.of(auth="alice:pw1, bob:pw2").secrets.auth_pairs == [("alice", "pw1"), ("bob", "pw2")]
    assert Config().secrets.auth_pairs == []
    assert config.resolve_cache_dir(settings.EngineSettings(cache_dir="/tmp/x")) == Path("/tmp/x")


def test_config_holds_its_concerns_nested():
    assert tuple(config.PARTS.values()) == settings.CONCERNS           # the table's order, each concern once
    names = [f.name for f in config.SETTING_FIELDS]
    assert names == list(settings.names_of(*settings.CONCERNS))          # the table's order, each name once
    assert len(set(names)) == len(names)
    for part, concern in config.PARTS.items():                           # the same defaults
        assert getattr(Config(), part) == concern()
    cfg = Config.of(max_batch=2, port=8080)                              # named flat, as flags name them
    assert (cfg.limits.max_batch, cfg.web.port, config.value_of(cfg, "max_batch")) == (2, 8080, 2)
    changed = config.replace(cfg, model="gpt2")
    assert (changed.engine.model, changed.limits, changed.web) == ("gpt2", cfg.limits, cfg.web)
    with pytest.raises(TypeError, match="no setting named 'modle'"):
        Config.of(modle="gpt2")
    with pytest.raises(ConfigError, match="port must be in 1..65535"):
        settings.WebSettings(port=0)                                  # a concern checks its own fields


def test_secrets_are_never_in_a_repr():
    key = secrets.token_urlsafe(32)
    cfg = Config.of(auth="alice:pw-in-auth", health_token="token-in-health", engine_key=key)
    for shown in (repr(cfg), str(cfg), repr(cfg.secrets),
                  repr(settings.Secrets(auth=cfg.secrets.auth, health_token=cfg.secrets.health_token))):
        assert not [secret for secret in ("pw-in-auth", "token-in-health", key) if secret in shown], shown
    assert "model='embedded'" in repr(cfg)                           # the rest is shown
    assert repr(Config.of(auth="u:p", health_token="x", engine_key="y" * 40)).count("y" * 40) == 0
    assert {f.name for f in config.SETTING_FIELDS if not f.repr} == set(settings.names_of(settings.Secrets))


def subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


FIELDS = {f.name: f for f in config.SETTING_FIELDS}
# What a string setting is set to below (every one but those with choices, a bool or a number).
SAMPLES = {"model": "some/model", "jlens": "none", "jlens_layers": "1,2", "cache_dir": "/tmp/x", "host": "0.0.0.0",
           "trusted_proxies": "2", "workshop": "w.yaml", "engine_url": "http://127.0.0.1:6677",
           "auth": "alice:pw", "health_token": "tok"}


def sample(name: str):
    """A valid value for `name` other than its default."""
    f = FIELDS[name]
    if f.metadata["choices"]:
        return next(c for c in f.metadata["choices"] if c != f.default)
    if isinstance(f.default, bool):
        return not f.default
    if isinstance(f.default, (int, float)):
        return {"max_model_len": 1024, "gpu_memory_utilization": 0.5}.get(name, f.default + 1)
    return SAMPLES[name]


def test_every_flag_of_serve_is_a_setting_and_back(tmp_path):
    """`lensapp serve`'s flags are the settings: each flag sets its field (read back from the Config), each field
    has one; a setting argv may not carry (the engine key) has a hidden flag that is refused, and the table says
    so."""
    parser = subcommand("serve")
    flags = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(flags) == set(FIELDS)
    keyfile = tmp_path / "key"
    keyfile.write_text(secrets.token_urlsafe(32))
    for name, action in flags.items():
        assert action.option_strings == [f"--{name.replace('_', '-')}"]
        if not FIELDS[name].metadata["argv"]:
            assert action.help == argparse.SUPPRESS and f"`{config.env_name(name)}` | (none: never argv)" in \
                config.settings_table()
            with pytest.raises(ConfigError, match="not taken on the command line"):
                config.from_args(parser.parse_args([action.option_strings[0], "x"]), {})
            continue
        value = str(keyfile) if name == "engine_key_file" else sample(name)
        argv = [action.option_strings[0]] if isinstance(value, bool) else [action.option_strings[0], str(value)]
        env = {config.env_name("engine_key"): secrets.token_urlsafe(32)} if name == "engine_url" else {}
        cfg = config.from_args(parser.parse_args(argv), env)
        changed = {n for n in FIELDS if config.value_of(cfg, n) != config.value_of(Config(), n)}
        with_key = name in ("engine_url", "engine_key_file")        # (the key from the environment, or the file)
        assert changed == ({name, "engine_key"} if with_key else {name}), (name, changed)
        assert config.value_of(cfg, name) == value


def test_the_other_commands_flags_are_settings_by_name():
    """The request commands take ENGINE_SETTINGS, `lensapp engine` its own list; each flag named for its field."""
    service = set(config.ENGINE_SETTINGS) | {"max_batch", "host", "port"}
    expected = {**{name: set(config.ENGINE_SETTINGS) for name in cli.commands()},
                "engine": service - {"engine_url", "insecure_engine", "backend"} | {"engine_key"}}
    for command, names in expected.items():
        actions = [a for a in subcommand(command)._actions if a.dest in FIELDS]
        assert {a.dest for a in actions} == names, command
        for a in actions:
            assert a.option_strings == [f"--{a.dest.replace('_', '-')}"] or (command, a.option_strings) == \
                ("engine", ["--key"]), (command, a.option_strings)     # the engine's old flag for the key: refused


def test_a_misspelled_setting_name_raises_and_is_never_skipped():
    assert settings.checked_names("model", "port") == ("model", "port")
    with pytest.raises(ValueError, match="no setting named 'modle'"):
        settings.checked_names("model", "modle")
    with pytest.raises(ValueError, match="'max_batches'"):
        config.add_arguments(argparse.ArgumentParser(), ("model", "max_batches"))
    assert set(config.ENGINE_SETTINGS) <= set(FIELDS) and len(set(config.ENGINE_SETTINGS)) == len(
        config.ENGINE_SETTINGS)


def test_engine_url_takes_a_list_of_engines_and_names_a_bad_entry():
    key = {"LENSAPP_ENGINE_KEY": secrets.token_urlsafe(32)}
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.from_args(parser.parse_args(["--max-batch", "3"]),
                           key | {"LENSAPP_ENGINE_URL": "http://127.0.0.1:6677, http://localhost:6678/"})
    assert cfg.remote.engine_urls == ("http://127.0.0.1:6677", "http://localhost:6678")
    assert config.requests_at_once(cfg) == 6 and config.requests_at_once(Config.of(max_batch=3)) == 3
    for bad, named in [("http://127.0.0.1:1,,http://127.0.0.1:2", "an empty entry"),
                       ("http://127.0.0.1:1,gpu-box:6677", "'gpu-box:6677'"),
                       ("http://127.0.0.1:1,http://127.0.0.1:1/", "names an engine twice"),
                       ("http://127.0.0.1:1,http://10.0.0.2:6677", "plain http beyond this machine")]:
        with pytest.raises(ConfigError, match=named) as refused:
            config.from_args(parser.parse_args([]), key | {"LENSAPP_ENGINE_URL": bad})
        assert "\n" not in str(refused.value)
