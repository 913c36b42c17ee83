"""What-if studies and regression checks built on replay: sweeps, predictions, comparisons."""
