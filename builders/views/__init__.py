"""Views of built files: inspect, diff, and explain (which reading of the contract made a file)."""
