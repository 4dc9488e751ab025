"""The contract suites' PE scripts, run by ``vkshmem run`` (:func:`vkshmem.testing.run_pes`),
never imported: each initializes vkshmem when it runs."""
