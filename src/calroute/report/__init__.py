"""PNG plots of results (the only package importing matplotlib); experiments/kit/report.py writes Markdown."""
