"""`python nan_train.py STEP ARGS...`: `posenc ARGS...` whose training loss turns NaN at STEP (1-based), on every
rank when torchrun starts it (`train_utils.nan_loss_at`); the DDP test's diverging job."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for train_utils

from train_utils import nan_loss_at

from posenc_cli.cli import main

if __name__ == "__main__":
    step, *args = sys.argv[1:]
    sys.argv = ["posenc", *args]
    with nan_loss_at(int(step)):
        main()
