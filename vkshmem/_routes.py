"""Run by ``vkshmem info`` under the launcher: each PE prints how it reaches every peer, for
the host heap (``PE i -> PE j: <route>``) and for every installed memory domain
(``PE i -> PE j: <domain> <route>``; the domains are opened here, collectively)."""

from vkshmem import shmem

rt = shmem._state.rt
for r in rt.routing.routes:
    rail = "" if r.rail is None else f" (rail {r.rail})"
    print(f"PE {rt.my_pe} -> PE {r.pe}: {r.name}{rail}")
for spec in rt.domains.specs:
    try:
        heap = rt.domains.domain(spec.name)
    except Exception as exc:  # the same on every PE for a missing device or driver
        print(f"PE {rt.my_pe}: domain {spec.name} cannot open: {exc}")
        continue
    for pe, route in enumerate(heap.route_names):
        print(f"PE {rt.my_pe} -> PE {pe}: {spec.name} {route}")
shmem.barrier_all()
