"""Run by ``vkshmem info`` under the launcher: each PE prints how it reaches every peer."""

from vkshmem import shmem

rt = shmem._state.rt
for r in rt.routes:
    rail = "" if r.rail is None else f" (rail {r.rail})"
    print(f"PE {rt.my_pe} -> PE {r.pe}: {r.name}{rail}")
shmem.barrier_all()
