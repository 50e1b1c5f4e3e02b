"""Layer 9: Optuna studies as the tuner and the planner both use them: storage, liveness and
heartbeats, coverage, fingerprints, run.json."""
