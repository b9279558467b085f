"""`kvplane sim` and `kvplane plan`: the cluster in virtual time.

clock (the event loop), fleet (simulated workers around the sim engine), simulator (the real
planner against them), workloads (the benchmarks' generators), report (the benchmarks' rows),
main (`kvplane sim`), plan (`kvplane plan`).
"""
