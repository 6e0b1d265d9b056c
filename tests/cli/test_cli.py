"""The CLI skeleton: every command is listed and implemented, versions print."""

from __future__ import annotations

from cli_utils import full_command_tree
from typer.testing import CliRunner

from posenc_cli.cli import app

runner = CliRunner()

COMMANDS = [
    "train",
    "eval-extrapolate",
    "eval-passkey",
    "extend",
    "sweep",
    "compare",
    "schemes",
    "data",
    "bench",
    "export",
    "viz",
]


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    for command in COMMANDS:
        assert command in result.output


def test_version_names_posenc_torch_python_and_device() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    for word in ("posenc", "torch", "Python", "device"):
        assert word in result.output


def test_every_command_is_implemented() -> None:
    for command in COMMANDS:
        result = runner.invoke(app, [command, "--help"], terminal_width=200)
        assert result.exit_code == 0, command
        assert "Not available yet" not in result.output, command


def _command_paths(command: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and sub-command of the click tree, as argument paths."""
    paths = [prefix]
    if hasattr(command, "commands"):  # a group (typer ships its own click classes)
        for name, sub in command.commands.items():
            paths += _command_paths(sub, (*prefix, name))
    return paths


def test_every_command_help_shows_an_example() -> None:
    paths = _command_paths(full_command_tree())[1:]
    assert len(paths) >= len(COMMANDS) + 3  # viz has three sub-commands
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, path
        assert "Example" in result.output and "posenc " + " ".join(path) in result.output, path


BAD_OVERRIDES = [
    ("model.n_layer=abc", "model.n_layer: expected an integer"),
    ("model.n_layr=4", "unknown config key 'model.n_layr'"),
    ("+model.n_layr=4", "unknown config key 'model.n_layr'"),
    ("model.n_head=3", "model.n_head=3 does not divide model.d_model=128"),
    ("data=nonexistent", "Could not find 'data/nonexistent'"),
]


def test_bad_overrides_exit_2_with_one_line_on_every_config_command() -> None:
    for command in (["train", "--cfg", "job"], ["train"], ["data"], ["sweep", "--dry-run"]):
        for override, message in BAD_OVERRIDES:
            result = runner.invoke(app, [*command, override])
            assert result.exit_code == 2, (command, override, result.output)
            assert message in result.stderr, (command, override, result.stderr)
            assert len(result.stderr.strip().splitlines()) == 1
            assert "Traceback" not in result.output


def test_shell_completion_completes_command_names() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "_POSENC_COMPLETE": "complete_bash", "COMP_WORDS": "posenc ev", "COMP_CWORD": "1"}
    code = "from posenc_cli.cli import main; main()"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    expected = ["eval-algorithmic", "eval-extrapolate", "eval-passkey", "eval-tasks"]
    assert sorted(result.stdout.split()) == expected, result.stderr
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_flags_show_no_value_type_in_help() -> None:
    # `--eval <bool>` read as if `--eval true` were expected (which then failed)
    for path in (["extend"], ["sweep"], ["eval-extrapolate"], []):
        result = runner.invoke(app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0
        assert "<bool>" not in result.output, path
    assert "<float>" in runner.invoke(app, ["extend", "--help"], terminal_width=200).output  # valued options keep it


USAGE_ERRORS = [
    (["trian"], "No such command 'trian'. Did you mean 'train'?"),
    (["extend", "run", "--eval=true"], "Option '--eval' does not take a value."),
    (["extend"], "Missing argument"),
    (["schemes", "extra"], "unexpected extra argument"),
    (["compare", "x", "--metrik", "bpb"], "unknown option --metrik"),
]


def test_click_usage_errors_are_one_line_and_exit_2() -> None:
    for args, message in USAGE_ERRORS:
        result = runner.invoke(app, args, terminal_width=200)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)  # no boxed panel
        assert "╭" not in result.output and result.stdout == ""


def test_config_dir_with_a_python_tag_is_one_line_and_runs_nothing(tmp_path) -> None:
    import os

    marker = tmp_path / "pwned"
    (tmp_path / "cfg" / "pos").mkdir(parents=True)
    (tmp_path / "cfg" / "pos" / "evil.yaml").write_text(
        f"name: rope\nbase: !!python/object/apply:os.system ['touch {marker}']\n"
    )
    os.mkfifo(tmp_path / "cfg" / "pos" / "later.yml")  # a FIFO would block Hydra's reader: never opened for reading
    for command in (["train", "--cfg", "job"], ["data"], ["sweep", "list"]):
        result = runner.invoke(app, [*command, "pos=evil", "--config-dir", str(tmp_path / "cfg")])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.output, result.output
        assert "evil.yaml: config file is not valid YAML (could not determine a constructor" in lines[0]
    assert not marker.exists()


def test_unknown_config_keys_and_groups_suggest_the_right_names() -> None:
    result = runner.invoke(app, ["train", "trian.steps=3", "--cfg", "job"], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "unknown config key 'trian.steps' (no group 'trian'; did you mean train?; groups: data," in result.output
    result = runner.invoke(app, ["train", "model.n_layr=3", "--cfg", "job"], terminal_width=200)
    assert "did you mean model.n_layer?" in result.output


def test_a_short_write_without_errno_is_a_disk_error_line() -> None:
    import typer

    from posenc_cli.cli.app import handles_errors

    stub = typer.Typer()

    @stub.command()
    @handles_errors
    def write() -> None:
        raise OSError("4096 requested and 1024 written")  # numpy's tofile on a full disk: no errno, no path

    result = runner.invoke(stub, [])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "No space left on device (short write: 4096 requested and 1024 written)" in result.output


def test_sigterm_outside_training_is_one_line_and_exit_143() -> None:
    """An evaluation killed by SIGTERM (Slurm's preemption signal) says so and exits 128 + 15, as training does; it
    used to die of the signal (exit −15) with no word."""
    import os
    import signal

    import typer

    from posenc_cli.cli.app import handles_errors

    stub = typer.Typer()
    stored = []

    @stub.command()
    @handles_errors
    def measure() -> None:
        stored.append("cell 1")
        os.kill(os.getpid(), signal.SIGTERM)
        stored.append("cell 2")  # never reached

    previous = signal.getsignal(signal.SIGTERM)
    result = runner.invoke(stub, [])
    assert result.exit_code == 143 and "Traceback" not in result.output, result.output
    assert "stopped by SIGTERM; results already stored are kept" in result.output
    assert stored == ["cell 1"] and signal.getsignal(signal.SIGTERM) is previous


def test_every_command_help_has_one_line_per_paragraph() -> None:
    """A docstring's source line breaks made --help ragged at 80 columns or in a pipe; rich wraps each paragraph
    to the terminal instead (commands and `viz` subcommands alike)."""
    import click

    def commands(group: click.Command, prefix: str = "") -> list[tuple[str, click.Command]]:
        out = []
        for name, cmd in getattr(group, "commands", {}).items():
            out.append((prefix + name, cmd))
            out += commands(cmd, prefix + name + " ")
        return out

    found = commands(full_command_tree())
    assert len(found) >= 15
    for name, cmd in found:
        for paragraph in (cmd.help or "").split("\n\n"):
            assert "\n" not in paragraph.strip(), f"posenc {name}: {paragraph!r}"
    result = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0 and all(len(line) <= 80 for line in result.output.splitlines()), result.output
