"""What the tests share, one package (docs/testing.md, "Shared helpers"): a test module imports
from here (or from conftest.py), never from another test module (tests/test_test_hygiene.py).

* `common`: runs of the CLI and the tuner, fixtures' models, studies, waits;
* `tiny_planner`: the tiny decoder's planner problem, its search space and a scripted compile pool;
* `postgres_server`: Debian's PostgreSQL started on loopback for a test session or a benchmark;
* `netns`: two hosts as network namespaces joined by a veth pair;
* `fuzz_strategies`: the Hypothesis grammars of every parser's input.
"""
