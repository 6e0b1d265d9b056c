"""Reading results back: `compare` across runs and sweeps, and the attention-by-distance `viz`."""
