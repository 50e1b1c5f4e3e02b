"""A tuning run from start to finish: its phases, its clock, its folder and study, its result."""
