"""The experiment as cells: cell specs, the grid, regimes, task selection and the checks `validate` runs."""
