"""errors: SIGTERM raised as `Stopped` (`sigterm_raises`, which the CLI installs for every command)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from posenc_cli.errors import Stopped, sigterm_raises


def test_sigterm_raises_stopped_outside_the_training_loop() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as stopped, sigterm_raises():
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("SIGTERM did not stop the block")
    assert stopped.value.signum == signal.SIGTERM and isinstance(stopped.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_signal_helpers_do_not_import_torch() -> None:
    """The CLI wraps every command in `sigterm_raises`, torch-free ones too."""
    code = "import sys, posenc_cli.errors; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
