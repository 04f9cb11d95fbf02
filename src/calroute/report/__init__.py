"""Reports: Markdown tables and PNG plots of experiment results."""
