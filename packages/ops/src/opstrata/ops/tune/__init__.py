"""The autotuner: tunable parameters, the on-disk cache and the pretuned table shipped with the package."""
