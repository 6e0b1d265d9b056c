"""Config-driven sweeps: stage plans, job execution and markers, and the one module that touches Hydra."""
