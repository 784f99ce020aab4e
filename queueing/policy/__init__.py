"""fairq's scheduling policy: pure Python, no Django, no settings, no clock.

Everything here takes a snapshot and `now` and returns decisions. The live scheduler
cycle, "why is my job waiting", the trace simulator and the benchmarks all call these same
functions. Rules are numbered in docs/scheduling.md and cited in docstrings.
"""
