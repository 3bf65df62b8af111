"""settings.py: flags > environment > config file > defaults, thread defaults, and
errors that name the flag (and where a bad value came from). No models needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from ssd_edge import settings
from ssd_edge.settings import engine_config, resolve
from ssd_edge.config import split_threads
from ssd_edge.errors import ConfigError
from ssd_edge.models.catalog import load_catalog


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    """Keep the user's own ~/.config/ssd-edge/config.toml out of these tests."""
    monkeypatch.setattr(settings, "default_config_file", lambda: tmp_path / "absent.toml")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_precedence_flag_over_env_over_file_over_default(tmp_path):
    cfg = write(tmp_path / "c.toml", 'threads = 3\ntemp = 0.5\nctx-size = 2048\nmode = "sd"\n')
    env = {"SSD_EDGE_THREADS": "2", "SSD_EDGE_TEMP": "0.7"}
    s = resolve({"threads": 1, "config": str(cfg)}, env)
    assert s["threads"] == 1 and s.sources["threads"] == "--threads"          # flag beats env and file
    assert s["temp"] == 0.7 and s.sources["temp"] == "SSD_EDGE_TEMP"         # env beats file
    assert s["ctx_size"] == 2048 and s.sources["ctx_size"] == str(cfg)       # file beats default
    assert s["top_k"] is None                                                # default applies later
    ec = engine_config(s, cores=2)
    assert (ec.target.threads, ec.sampling.temperature, ec.n_ctx, ec.mode) == (1, 0.7, 2048, "sd")
    assert ec.sampling.top_k == 40


def test_config_file_from_env_and_default_location(tmp_path, monkeypatch):
    cfg = write(tmp_path / "c.toml", "top-k = 7\n")
    assert resolve({}, {"SSD_EDGE_CONFIG": str(cfg)})["top_k"] == 7
    home_cfg = write(tmp_path / "home.toml", "top_p = 0.5\n")
    monkeypatch.setattr(settings, "default_config_file", lambda: home_cfg)
    s = resolve({}, {})
    assert s["top_p"] == 0.5 and s.config_file == home_cfg


def test_models_dir_env_is_ssd_edge_models(tmp_path):
    s = resolve({}, {"SSD_EDGE_MODELS": str(tmp_path / "m")})
    assert s.models_dir == tmp_path / "m"
    assert resolve({"models_dir": str(tmp_path / "f")}, {"SSD_EDGE_MODELS": str(tmp_path / "m")}).models_dir \
        == tmp_path / "f"


def test_stop_repeats_and_switches():
    s = resolve({"stop": ["\n\n", "END"], "no_draft": True}, {})
    assert s["stop"] == ["\n\n", "END"] and s["no_draft"] is True
    s = resolve({"stop": []}, {"SSD_EDGE_STOP": "###", "SSD_EDGE_NO_DRAFT": "yes"})
    assert s["stop"] == ["###"] and s["no_draft"] is True


def test_default_models_and_mode(tmp_path):
    cat = load_catalog()
    ec = engine_config(resolve({}, {"SSD_EDGE_MODELS": str(tmp_path)}), cores=2)  # no derived draft there
    assert ec.target.path == cat.default_target and ec.draft.path == cat.default_draft
    # auto by default; on 2 cores its two models take turns, each with both cores
    assert ec.mode == "auto" and (ec.target.threads, ec.draft.threads) == (2, 2)
    # another target: no default draft, so auto plans plain steps and n-grams (all cores to the target)
    ec = engine_config(resolve({"model": "smollm2-135m"}, {}), cores=2)
    assert ec.draft is None and ec.mode == "auto" and ec.target.threads == 2
    ec = engine_config(resolve({"no_draft": True}, {}), cores=4)
    assert ec.draft is None and ec.mode == "auto" and ec.target.threads == 4


@pytest.mark.parametrize("mode,cores,given,expected", [
    ("ssd", 2, (None, None), (1, 1)),
    ("ssd", 4, (None, None), (3, 1)),
    ("ssd", 8, (None, None), (6, 2)),
    ("ssd", 1, (None, None), (1, 1)),
    ("ssd", 4, (2, None), (2, 2)),
    ("ssd", 4, (None, 2), (2, 2)),
    ("auto", 2, (None, None), (2, 2)),
    ("auto", 4, (None, None), (3, 1)),
    ("sd", 2, (None, None), (2, 2)),
    ("ar", 4, (None, None), (4, 4)),
    ("lookup", 2, (None, 1), (2, 1)),
])
def test_default_threads(mode, cores, given, expected):
    assert split_threads(mode, True, cores, *given) == expected


def test_seed_minus_one_is_random_and_n_predict():
    s = resolve({"seed": -1, "n_predict": -1}, {})
    assert engine_config(s, cores=2).sampling.seed is None
    assert s.max_tokens(256, 4096) == 4096
    assert resolve({}, {}).max_tokens(256, 4096) == 256
    with pytest.raises(ConfigError, match=r"invalid -n/--n-predict 0: must be at least 1, or -1"):
        resolve({"n_predict": 0}, {}).max_tokens(256, 4096)


@pytest.mark.parametrize("flags,message", [
    ({"temp": -1.0}, "invalid --temp -1.0: must be at least 0"),
    ({"top_p": 0.0}, "invalid --top-p 0.0: must be greater than 0"),
    ({"top_p": 1.5}, "invalid --top-p 1.5: must be at most 1"),
    ({"min_p": 1.0}, "invalid --min-p 1.0: must be less than 1"),
    ({"draft_max": 0}, "invalid -k/--draft-max 0: must be at least 1"),
    ({"top_k": -3}, "invalid --top-k -3: must be at least 0"),
    ({"threads": 0}, "invalid -t/--threads 0: must be at least 1"),
    ({"ctx_size": 10}, "invalid -c/--ctx-size 10: must be at least 64"),
    ({"mode": "fast"}, "invalid --mode 'fast': choose one of ar, sd, lookup, ssd, auto"),
    ({"no_draft": True, "mode": "ssd"}, "--mode ssd needs a draft model, and --no-draft was given"),
    ({"model": "smollm2-135m", "mode": "sd"}, "--mode sd needs a draft model, and no draft model is set"),
])
def test_invalid_values_name_the_flag(flags, message):
    with pytest.raises(ConfigError) as e:
        engine_config(resolve(flags, {}), cores=2)
    assert message in str(e.value)
    assert e.value.exit_code == 2


def test_errors_say_where_a_value_came_from(tmp_path):
    with pytest.raises(ConfigError, match=r"invalid --temp -2.0 \(from SSD_EDGE_TEMP\): must be at least 0"):
        engine_config(resolve({}, {"SSD_EDGE_TEMP": "-2"}), cores=2)
    cfg = write(tmp_path / "c.toml", "top-p = 2.0\n")
    with pytest.raises(ConfigError, match=rf"invalid --top-p 2.0 \(from {cfg}\): must be at most 1"):
        engine_config(resolve({"config": str(cfg)}, {}), cores=2)
    with pytest.raises(ConfigError, match=r"invalid -t/--threads 'many' \(from SSD_EDGE_THREADS\): expected an integer"):
        resolve({}, {"SSD_EDGE_THREADS": "many"})
    with pytest.raises(ConfigError, match=r"invalid --no-draft 'maybe' \(from SSD_EDGE_NO_DRAFT\)"):
        resolve({}, {"SSD_EDGE_NO_DRAFT": "maybe"})


@pytest.mark.parametrize("text,message", [
    ("tempo = 1\n", "unknown setting 'tempo' in config file"),
    ('temp = "hot"\n', "invalid --temp 'hot'"),
    ("temp = [\n", "is not valid TOML"),
    ("stop = [1, 2]\n", "expected a string or a list of strings"),
    ("threads = 1.5\n", "expected an integer"),
])
def test_bad_config_file(tmp_path, text, message):
    cfg = write(tmp_path / "c.toml", text)
    with pytest.raises(ConfigError, match=message):
        resolve({"config": str(cfg)}, {})


def test_missing_config_file_given_explicitly(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        resolve({"config": str(tmp_path / "nope.toml")}, {})
