"""Run directories: training, checkpoints and run metadata, transformers checkpoints as runs, export, and what a
training run needs around the model (optimiser, devices, precision, progress, trackers, interrupts)."""
