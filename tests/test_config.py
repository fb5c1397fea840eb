"""Settings: one frozen Config from flags and LENSAPP_* variables; the README's table is generated from it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lensapp import config
from lensapp.config import Config, ConfigError

HOSTING = Path(__file__).resolve().parents[1] / "docs" / "hosting.md"


def test_the_hosting_guide_lists_every_setting_as_config_defines_it():
    assert config.settings_table() in HOSTING.read_text()


def test_flags_win_over_variables_which_win_over_defaults():
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    env = {"LENSAPP_MAX_BATCH": "4", "LENSAPP_RATE_LIMIT": "7", "GRADIO_SERVER_PORT": "8080"}
    cfg = config.from_args(parser.parse_args(["--max-batch", "2"]), env)
    assert (cfg.max_batch, cfg.rate_limit, cfg.port, cfg.queue_size) == (2, 7, 8080, Config().queue_size)


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
    assert Config(auth="alice:pw1, bob:pw2").auth_pairs == [("alice", "pw1"), ("bob", "pw2")]
    assert Config().auth_pairs == []
    assert Config(cache_dir="/tmp/x").resolved_cache_dir == Path("/tmp/x")
