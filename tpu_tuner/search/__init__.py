"""What to try: declarative search spaces."""

from tpu_tuner.search.space import Param, SearchSpace

__all__ = ["Param", "SearchSpace"]
