"""The MFU dashboard (`tpu-tune dashboard`): every run and plan of a results folder in one page.

collect.py reads the run folders into a pandas table (collection.py: what it holds), plots.py
draws the matplotlib figures, page.py renders the self-contained HTML page, serve.py serves it over HTTP.
"""

from tpu_tuner.dashboard.collect import collect, write_csv
from tpu_tuner.dashboard.collection import Collection
from tpu_tuner.dashboard.page import render_page, write_dashboard
from tpu_tuner.dashboard.serve import DashboardServer, make_server

__all__ = ["Collection", "DashboardServer", "collect", "make_server", "render_page", "write_csv", "write_dashboard"]
