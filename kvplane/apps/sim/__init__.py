"""`kvplane sim` and `kvplane plan`: the cluster in virtual time.

clock (the event loop), fleet (simulated workers around the sim engine), simulator (the real
planner against them), workloads (the benchmarks' generators), report (the benchmarks' rows),
sweep (one command's runs: fleet, policies, levels), main (`kvplane sim`), grid (`kvplane sim --grid`:
the decision grid against the peers' policies), plan (`kvplane plan`).
"""
