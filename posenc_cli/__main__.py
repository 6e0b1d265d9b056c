"""`python -m posenc_cli ...` (what `torchrun -m posenc_cli` runs)."""

from posenc_cli.cli import main

main()
