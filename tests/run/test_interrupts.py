"""interrupts: SIGINT/SIGTERM become a flag (a second signal interrupts at once), and one trainer per run dir."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from posenc_cli.errors import CheckpointError, Stopped, sigterm_raises
from posenc_cli.run.distributed import SINGLE
from posenc_cli.run.interrupts import Interrupts, run_lock


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_is_noted_and_the_handlers_come_back(signum: int) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with Interrupts() as interrupts:
        assert interrupts.signum is None
        signal.raise_signal(signum)
        assert interrupts.signum == signum and interrupts.pending is None
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_second_signal_interrupts_at_once() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), Interrupts() as interrupts:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("the second signal did not interrupt")
    assert interrupts.signum == signal.SIGTERM
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_deferred_signal_stops_only_once_agreed() -> None:
    with Interrupts(defer=True) as interrupts:
        interrupts.agree(SINGLE, torch.device("cpu"))
        assert interrupts.signum is None  # nothing received: keep going
        signal.raise_signal(signal.SIGTERM)
        assert interrupts.signum is None and interrupts.pending == signal.SIGTERM  # noted, not acted on
        interrupts.agree(SINGLE, torch.device("cpu"))
        assert interrupts.signum == signal.SIGTERM


def test_run_lock_admits_one_trainer_at_a_time(tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="the run lock is skipped where fcntl does not exist")
    held = pytest.raises(CheckpointError, match="being trained by another process")
    with run_lock(tmp_path), held, run_lock(tmp_path):  # a second lock while the first is held
        pass
    with run_lock(tmp_path):  # released on exit
        pass


def test_the_training_loop_takes_over_sigterm_and_hands_it_back() -> None:
    with sigterm_raises():
        with Interrupts() as interrupts:
            signal.raise_signal(signal.SIGTERM)  # noted by the loop: no exception
            assert interrupts.signum == signal.SIGTERM
        with pytest.raises(Stopped):  # after the loop, SIGTERM stops the command again
            signal.raise_signal(signal.SIGTERM)
