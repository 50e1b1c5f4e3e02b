"""What calibrates: the prediction's constants fitted to published runs (`fitting.py`), and the
kept fit beside the rows it was fitted to."""
