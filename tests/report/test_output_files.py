"""Report files: a kill mid-write leaves nothing the next write keeps; an unwritable place is one line, exit 2."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure
from test_compare import fake_run
from test_plots import RESULTS
from typer.testing import CliRunner

from posenc_cli.analysis import compare
from posenc_cli.analysis import rows as row_setup
from posenc_cli.analysis.gather import gather
from posenc_cli.cli import app
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.report import output_files, plots

runner = CliRunner()


def _killed_mid_write(out: Path, records: list[row_setup.RunRecord], monkeypatch: pytest.MonkeyPatch) -> None:
    """`compare.write_outputs` in a forked child that SIGKILLs itself halfway through drawing the per-position plot
    (whatever file it draws into): no `finally`, no cleanup, as under `kill -9`."""
    real = Figure.savefig

    def dies_in_second_plot(fig: Figure, fname: Any, *args: Any, **kwargs: Any) -> None:
        if "per_position" in str(fname):
            Path(fname).write_bytes(b"\x89PNG half")
            os.kill(os.getpid(), signal.SIGKILL)
        real(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", dies_in_second_plot)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        try:
            compare.write_outputs(records, out)
        finally:
            os._exit(0)  # only reached if the kill did not happen
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    monkeypatch.setattr(Figure, "savefig", real)


def test_a_kill_during_compare_out_leaves_nothing_the_next_run_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_run(tmp_path / "runs" / "rope", "rope", {16: 10.0, 32: 12.0}, [1.0, 2.0])
    records = gather([tmp_path / "runs"])
    out = tmp_path / "out"
    out.mkdir()
    foreign = out / ".per_position.png.abc123.tmp"  # someone else's temporary: never ours to delete
    foreign.write_text("not posenc's")
    live = out / output_files.staging_name(pid=1)  # a live process's staging directory (pid 1 always runs)
    live.mkdir()
    _killed_mid_write(out, records, monkeypatch)

    left = sorted(p.name for p in out.iterdir())
    assert not (out / "results.json").exists() and not (out / "per_position.png").exists()  # nothing half in place
    stale = [n for n in left if n.startswith(output_files.STAGING_PREFIX) and n != live.name]
    assert len(stale) == 1 and stale[0].startswith(f".posenc-staging.{socket.gethostname()}.")
    assert not [n for n in left if n.endswith(".tmp") and n != foreign.name]  # no stray temporary files

    result = runner.invoke(app, ["compare", str(tmp_path / "runs"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [foreign.name, live.name, "results.json", "results.csv", "extrapolation.png", "per_position.png"]
    )
    assert foreign.read_text() == "not posenc's" and live.is_dir()
    assert (out / "per_position.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_out_into_an_unwritable_place_is_one_line(tmp_path: Path) -> None:
    fake_run(tmp_path / "runs" / "rope", "rope", {16: 10.0}, [1.0])
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = runner.invoke(app, ["compare", str(tmp_path / "runs"), "--out", str(blocker / "out")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and f"cannot write {blocker / 'out'}" in " ".join(result.output.split())
    assert "Perplexity" not in result.output  # refused before any table was printed
    with pytest.raises(UserError, match="Not a directory"):
        output_files.check_writable_dir(blocker / "deeper" / "still")


def test_plot_into_an_unwritable_place_or_format_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UserError, match=f"cannot write {blocker / 'ppl.png'}: Not a directory"):
        plots.write_plots(RESULTS, blocker / "ppl.png")
    with pytest.raises(UserError, match="it is a directory"):
        plots.write_plots(RESULTS, tmp_path)
    with pytest.raises(ConfigError, match=r"cannot write a \.xyz figure"):
        plots.write_plots(RESULTS, tmp_path / "ppl.xyz")
    assert plots.write_plots(RESULTS, tmp_path / "ppl.png")[1].name == "ppl_per_position.png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "ppl.png", "ppl_per_position.png"]
