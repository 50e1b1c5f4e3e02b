"""Layer 0, the ground floor: errors, the failure vocabulary, units, plain data, credentials,
hardware tables, host facts, run-folder names and declarative definitions. Imports nothing else
of the package."""
