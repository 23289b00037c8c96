"""agent.toml and the remote parts of targets.toml: errors name file, line and field;
`iepm agent token` and `iepm target add` produce files that load and keep secrets private."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from iepm.cli import app
from iepm.config import load_config, load_config_text
from iepm.errors import ConfigError
from iepm.remote.trust import load_agent_config, load_agent_config_text, token_digest

runner = CliRunner()
DIGEST = "a" * 64


def test_agent_toml_errors_name_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        "[agent]\n"
        'state_dir = "/tmp/x"\n'
        "\n"
        "[[monitors]]\n"
        'name = "slac"\n'
        f'token_sha256 = "{DIGEST}"\n'
        "[monitors.limits]\n"
        "max_streams = 500\n"
    )
    with pytest.raises(ConfigError) as err:
        load_agent_config(path)
    assert str(err.value) == (
        f"{path}:8: monitors[0].limits.max_streams: Input should be less than or equal to 128 "
        "(got 500)"
    )


def test_a_token_pasted_where_its_hash_belongs_is_refused_without_echoing_it() -> None:
    token = "iepm1.secret-value-that-must-not-be-echoed"
    with pytest.raises(ConfigError) as err:
        load_agent_config_text(f'[[monitors]]\nname = "m"\ntoken_sha256 = "{token}"\n')
    assert "64 lower-case hex digits" in str(err.value)
    assert token not in str(err.value)


def test_two_monitors_with_one_token_are_refused() -> None:
    text = "".join(f'[[monitors]]\nname = "{n}"\ntoken_sha256 = "{DIGEST}"\n' for n in "ab")
    with pytest.raises(ConfigError, match="share one token"):
        load_agent_config_text(text)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('mode = "agent"\n', "mode = 'agent' needs a [targets.agent] table"),
        (
            'mode = "plain"\n[targets.ssh]\nuser = "iepm"\nkey_file = "/k"\n',
            "[targets.ssh] is given but mode = 'plain'",
        ),
        (
            'mode = "ssh"\n[targets.ssh]\nuser = "x;reboot"\nkey_file = "/k"\n',
            "not a POSIX user name",
        ),
        (
            'mode = "agent"\n[targets.agent]\nurl = "ftp://h"\ncredential_file = "/t"\n',
            "agent url must be like http://host:8700",
        ),
    ],
)
def test_remote_modes_in_targets_toml_are_validated(extra: str, message: str) -> None:
    text = '[[targets]]\nname = "t"\naddress = "198.18.0.5"\n' + extra
    with pytest.raises(ConfigError) as err:
        load_config_text(text)
    assert message in str(err.value)


def test_a_target_name_with_shell_metacharacters_is_rejected() -> None:
    with pytest.raises(ConfigError, match="target names are"):
        load_config_text('[[targets]]\nname = "a;rm -rf /"\naddress = "198.18.0.5"\n')


def test_agent_token_writes_a_private_token_and_prints_only_its_hash(tmp_path: Path) -> None:
    out = tmp_path / "m.token"
    result = runner.invoke(app, ["agent", "token", "--monitor", "slac-mon", "--output", str(out)])
    assert result.exit_code == 0, result.output
    token = out.read_text().strip()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert token not in result.output
    stanza = result.output.split("\n", 1)[1]
    config = load_agent_config_text(stanza)
    assert config.authenticate(token) is config.monitors[0]
    assert config.monitors[0].name == "slac-mon"


def test_target_add_agent_mode_enrols_in_one_step(tmp_path: Path) -> None:
    targets = tmp_path / "targets.toml"
    targets.write_text('[monitor]\nname = "slac-mon"\n')
    creds = tmp_path / "creds"
    argv = ["target", "add", "cern-1", "198.18.0.10", "--mode", "agent", "--monitor", "slac-mon"]
    result = runner.invoke(app, [*argv, "--credential-dir", str(creds), "--config", str(targets)])
    assert result.exit_code == 0, result.output
    token = (creds / "cern-1.token").read_text().strip()
    assert token not in result.output and token not in targets.read_text()
    assert token_digest(token) in result.output
    target = load_config(targets).target("cern-1")
    assert target.mode == "agent" and target.agent is not None
    assert target.agent.url == "http://198.18.0.10:8700"
    # The printed stanza is what the agent's agent.toml needs.
    stanza = result.output[result.output.index("[[monitors]]") :].split("\n\n")[0]
    assert load_agent_config_text(stanza).authenticate(token) is not None


def test_target_add_ssh_mode_makes_a_key_and_prints_the_authorized_keys_line(
    tmp_path: Path,
) -> None:
    argv = ["target", "add", "fnal", "198.18.0.11", "--mode", "ssh", "--ssh-user", "iepm"]
    result = runner.invoke(app, [*argv, "--credential-dir", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    key = tmp_path / "c" / "iepm_ssh_ed25519"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert re.search(r"^restrict ssh-ed25519 \S+ iepm-monitor$", result.output, re.MULTILINE)
    assert "PRIVATE KEY" not in result.output
    stanza = result.output[result.output.index("[[targets]]") :]
    target = load_config_text(stanza).target("fnal")
    assert target.ssh is not None and target.ssh.key_file == str(key)


def test_target_add_refuses_a_bad_name_before_writing_anything(tmp_path: Path) -> None:
    creds = tmp_path / "c"
    argv = ["target", "add", "a;reboot", "198.18.0.5", "--mode", "agent"]
    result = runner.invoke(app, [*argv, "--credential-dir", str(creds)])
    assert result.exit_code == 2
    assert "target names are" in result.output
    assert not creds.exists()
