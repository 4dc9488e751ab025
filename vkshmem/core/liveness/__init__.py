"""Failure detection: the liveness channel every PE holds (:mod:`.channel`) and the hub PE 0
hosts (:mod:`.hub`)."""
