"""Views of built files: inspect, diff, and explain.

``explain`` finds which reading of the contract made a file.
"""
