"""The search: the space, the trials Optuna asks for, what they record, seeds and failure learning."""
