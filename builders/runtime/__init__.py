"""How a command runs: stop signals, progress, timings, outputs.

Stop signals, progress, stage timings, and outputs written whole or not at all.
"""
