"""Hyperparameter sweeps: a spec, its trials as ordinary queued jobs, their results."""
