"""What every experiment runs on: cells and their results, the runner, the simulated and live backends, the
saturation search, the report's tables and plots, and the plain comparison `calroute simulate` and
`calroute run` share. The experiments themselves (the catalogue) are the modules beside this package."""
