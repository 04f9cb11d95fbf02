"""PNG plots of results (the only package that imports matplotlib); experiments/report.py writes Markdown."""
