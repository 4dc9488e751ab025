"""Who takes part in a job served by the bootstrap store, and in which *generation*.

A PE's member connection to the store lives from its ``init`` to its last ``finalize``. The
first connection of a rank is generation 0. OpenSHMEM 1.6 lets a program call ``init`` again
after its last ``finalize``: the same process then connects again, as generation 1, and so on.
The store numbers allgather rounds per generation, so the collectives of a re-initialised
runtime never pair with those of the previous one, even while a slower PE is still saying
goodbye to the old one.

Who may connect (:meth:`Members.admit`):

* a rank that never connected;
* a rank whose previous connection ended *cleanly* (a goodbye: it finalized), from the same
  process (the token of its hello), which was not seen to exit.

Refused, with a text naming the problem:

* a rank that is connected now (a second live process claiming it);
* a rank whose previous connection ended without a goodbye: its process crashed or lost the
  store; that is a failure of the job (:attr:`Refusal.failure`), not a re-initialisation;
* a rank that finalized in another process (two processes with the same rank).

Not thread-safe: the store calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Member", "Members", "Refusal"]

_BYE = "it closed its bootstrap (finalized)"
_DROP = ("its connection to the bootstrap store closed without a goodbye (did it exit or "
         "crash?)")


@dataclass
class Member:
    """What the store knows of one rank: its latest member connection and its process."""

    token: bytes  #: the process token its hellos carry
    pid: int  #: the process id its hellos gave (for messages)
    generation: int = 0  #: of its latest connection
    connected: bool = True
    said_bye: bool = False  #: its latest connection ended with a goodbye
    exited: bool = False  #: its process ended (the launcher saw it)

    @property
    def dropped(self) -> bool:
        """Its latest connection ended without a goodbye."""
        return not self.connected and not self.said_bye


@dataclass(frozen=True)
class Refusal:
    """Why a hello is refused; ``failure``: the refusal also means the job has failed."""

    text: str
    failure: bool = False


def generation_name(generation: int) -> str:
    """``''`` for the first runtime, ``' of runtime generation 2'`` after re-inits."""
    return f" of runtime generation {generation}" if generation else ""


class Members:
    """The member table of a job of ``size`` PEs."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_rank: dict[int, Member] = {}

    def get(self, rank: int) -> Member | None:
        """The record of ``rank``, or None if it never connected."""
        return self._by_rank.get(rank)

    def connected(self, up_to: int | None = None) -> list[int]:
        """Ranks connected now (only those in a generation <= ``up_to``, if given)."""
        return sorted(r for r, m in self._by_rank.items()
                      if m.connected and (up_to is None or m.generation <= up_to))

    def admit(self, rank: int, token: bytes, pid: int) -> int | Refusal:
        """A member hello of ``rank`` from the process ``token``/``pid``: its generation, or
        why it is refused."""
        m = self._by_rank.get(rank)
        if m is None:
            self._by_rank[rank] = Member(token, pid)
            return 0
        if m.connected:
            return Refusal(f"PE {rank} is already connected (process {m.pid}; two processes "
                           f"with the same rank?). A PE connects again only after its "
                           f"previous connection closed at shmem.finalize()")
        if m.dropped:
            return Refusal(f"PE {rank} cannot join again: its previous connection "
                           f"(generation {m.generation}, process {m.pid}) ended without a "
                           f"goodbye, so that PE failed (crashed or lost the store) instead "
                           f"of finalizing", failure=True)
        if m.token != token:
            return Refusal(f"PE {rank} finalized in process {m.pid}; process {pid} cannot "
                           f"take its rank (two processes with the same rank? only the "
                           f"process that finalized may initialise again)")
        if m.exited:  # cannot happen to a live process; kept for a launcher's late news
            return Refusal(f"PE {rank}'s process {m.pid} has exited")
        m.generation += 1
        m.connected, m.said_bye, m.pid = True, False, pid
        return m.generation

    def leave(self, rank: int, said_bye: bool) -> str:
        """``rank``'s member connection ended (with a goodbye or not); returns why it left."""
        m = self._by_rank[rank]
        m.connected, m.said_bye = False, said_bye
        return _BYE if said_bye else _DROP

    def exited(self, rank: int) -> bool:
        """The launcher saw ``rank``'s process end; True if that changes anything."""
        m = self._by_rank.get(rank)
        if m is None or m.exited:
            return False
        m.exited = True
        return True

    def absent(self, rank: int, generation: int, fail_fast: bool) -> str | None:
        """Why ``rank`` can never contribute to a pending round of ``generation`` that it has
        not contributed to, or None while it still may (then the round's time limit bounds
        the wait). Without ``fail_fast``, a PE that dropped its connection is left to the
        launcher, which ends the job and names the real cause."""
        m = self._by_rank.get(rank)
        if m is None or (m.connected and m.generation <= generation):
            return None
        if m.generation > generation:
            return (f"it finalized and initialised again (now in generation {m.generation}) "
                    f"without taking part in this round (every PE must make the same "
                    f"collective calls in the same order)")
        if m.exited:
            return ("its process exited " + ("after it finalized" if m.said_bye else
                                             "without finalizing")
                    + (f" (generation {m.generation}); it did not initialise again"
                       if m.generation < generation else ""))
        if m.dropped:
            return _DROP if fail_fast else None
        return _BYE if m.generation == generation else None

    def notes(self, missing: Iterable[int], generation: int) -> list[str]:
        """For a timeout message: what is known of the ``missing`` ranks."""
        never, left, behind = [], [], []
        for r in sorted(missing):
            m = self._by_rank.get(r)
            if m is None:
                never.append(r)
            elif m.generation < generation:
                behind.append(f"PE {r} (generation {m.generation}, "
                              + ("still connected" if m.connected else
                                 "finalized" if m.said_bye else "dropped") + ")")
            elif not m.connected:
                left.append(f"PE {r}: {_BYE if m.said_bye else _DROP}")
        out = []
        if never:
            out.append("never connected: " + ", ".join(map(str, never)))
        if left:
            out.append("left: " + "; ".join(left))
        if behind:
            out.append("not initialised again yet: " + ", ".join(behind))
        return out
