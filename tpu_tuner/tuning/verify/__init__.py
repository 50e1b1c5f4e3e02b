"""After the search: the leaders raced and the best verified against the baseline, interleaved."""
