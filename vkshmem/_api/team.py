"""Teams: ``Team`` objects, ``TEAM_WORLD``, ``TEAM_SHARED``, ``TEAM_INVALID`` (shmem4py names).

Splitting is collective over the parent team; PEs left out of the new team get
``TEAM_INVALID``. ``destroy`` is collective over the team. Team PE numbers are team-relative.

Handles behave as shmem4py's: ``Team(other)`` is an alias of ``other``; ``destroy()`` makes
the handle it is called on ``TEAM_INVALID`` (falsy, equal to ``TEAM_INVALID``); destroying an
alias of ``TEAM_WORLD``/``TEAM_SHARED`` invalidates only the alias, and the three predefined
handles never change. Other aliases of a destroyed team keep their stale handle (truthy, as in
shmem4py); using one raises an error naming the destroyed team. Where OpenSHMEM returns -1 or
a nonzero status (``TEAM_INVALID``'s ``my_pe``/``n_pes``, ``translate_pe`` of a non-member,
an invalid split) these methods raise an :class:`InvalidArgumentError`, a RuntimeError like
shmem4py's.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.fast import entry
from ..core.teams import TeamState
from . import ctx as _ctx
from . import state
from . import streamcoll as _streamcoll
from .ctx import Ctx, close_team_contexts
from .ptr import ptr

__all__ = ["TEAM_INVALID", "TEAM_SHARED", "TEAM_WORLD", "Team", "sync", "team_ptr"]


class Team:
    """A team of PEs. ``Team(other)`` is an alias of ``other`` (they compare equal)."""

    _kind: str  # "world", "shared", "split" or "invalid"
    _ts: TeamState | None
    _config: dict[str, int]

    def __new__(cls, team: Team | None = None) -> Team:
        self = super().__new__(cls)
        if isinstance(team, Team):
            self._kind, self._ts, self._config = team._kind, team._ts, team._config
        elif team is None:
            self._kind, self._ts, self._config = "invalid", None, {}
        else:
            raise TypeError(f"Team() takes a Team, got {type(team).__name__}")
        return self

    @classmethod
    def _make(cls, kind: str, ts: TeamState | None, config: Mapping[str, int]) -> Team:
        self = super().__new__(cls)
        self._kind, self._ts, self._config = kind, ts, dict(config)
        return self

    @property
    def state(self) -> TeamState:
        """The core's view of this team (raises for an invalid or destroyed team)."""
        if self._kind == "world":
            return state.rt.world
        if self._kind == "shared":
            return state.rt.shared
        ts = self._ts
        if ts is None:
            raise InvalidArgumentError("TEAM_INVALID (or a destroyed team) cannot be used")
        if ts.destroyed:
            raise InvalidArgumentError("this team was destroyed (through another handle of it)")
        if ts.rt is not state.rt:
            raise InvalidArgumentError("this team belongs to a runtime that was finalized; "
                                       "split it again after init")
        return ts

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Team):
            return NotImplemented
        if self._kind != "split" or other._kind != "split":
            return self._kind == other._kind
        return self._ts is other._ts

    def __hash__(self) -> int:
        return hash((self._kind, id(self._ts)))

    def __bool__(self) -> bool:
        return self._kind != "invalid"

    def __repr__(self) -> str:
        if not self:
            return "Team(TEAM_INVALID)"
        if self._ts is not None and self._ts.destroyed:
            return "Team(destroyed)"
        ts = self.state
        return f"Team({self._kind}, pes={list(ts.pes)}, slot={ts.slot})"

    def __enter__(self) -> Team:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- queries -----------------------------------------------------------------------------

    def my_pe(self) -> int:
        """This PE's number within the team."""
        return self.state.me

    def n_pes(self) -> int:
        """Number of PEs in the team."""
        return self.state.size

    def get_config(self) -> dict[str, int]:
        """The configuration the team was created with (``num_contexts``; 0 when not given,
        and for ``TEAM_INVALID``)."""
        return {"num_contexts": self._config.get("num_contexts", 0)}

    def translate_pe(self, pe: int | None = None, team: Team | None = None) -> int:
        """Team PE ``pe`` (default: this PE) as a PE of ``team`` (default: the world). Raises
        InvalidArgumentError (a RuntimeError, as shmem4py) where OpenSHMEM returns -1: ``pe``
        is not a member of both teams, or either team is invalid."""
        src = self.state
        dest = (TEAM_WORLD if team is None else team).state
        if pe is None:
            pe = src.me
        out = src.translate(pe, dest) if 0 <= pe < src.size else -1
        if out < 0:
            raise InvalidArgumentError(
                f"translate_pe: PE {pe} of this team of {src.size} is not a member of the "
                "destination team (OpenSHMEM returns -1)")
        return out

    # -- collective operations ------------------------------------------------------------

    def sync(self, *, stream: Any = None) -> None:
        """Collective over the team: wait until every member arrives. With ``stream``
        (keyword-only): on the stream for the team of every PE, as ``sync_all(stream=)``;
        other teams synchronize the stream, then sync."""
        if stream is not None and _streamcoll.team_sync(self.state, stream):
            return
        self.state.sync()

    def split_strided(self, start: int = 0, stride: int = 1, size: int | None = None,
                      config: Mapping[str, int] | None = None, **kwargs: int) -> Team:
        """Collective over this team: a team of PEs ``start, start+stride, ...`` (``size`` of
        them; default: as many as fit). PEs not in it get ``TEAM_INVALID``. A selection of no
        PEs, or of PEs outside this team, raises (OpenSHMEM's nonzero return) on every PE.
        ``config``/keywords: ``num_contexts``."""
        ts = self.state
        n = ts.size
        if size is None:
            if stride <= 0:
                raise InvalidArgumentError("size is required when stride <= 0")
            size = len(range(start, n, stride))
        conf = _config({**(config or {}), **kwargs})
        members = [start + i * stride for i in range(size)]
        if size <= 0 or any(not 0 <= m < n for m in members) or len(set(members)) != size:
            raise InvalidArgumentError(
                f"split_strided(start={start}, stride={stride}, size={size}) does not select "
                f"one or more distinct PEs of a team of {n}")
        (new,) = ts.split([[members]])
        return Team._make("split", new, conf) if new is not None else TEAM_INVALID

    def split_2d(self, xrange: int, xaxis_config: Mapping[str, int] | None = None,
                 yaxis_config: Mapping[str, int] | None = None) -> tuple[Team, Team]:
        """Collective over this team: a 2-D grid with ``xrange`` PEs per row; returns this
        PE's (row team, column team)."""
        ts = self.state
        n = ts.size
        if xrange < 1:
            raise InvalidArgumentError(f"xrange must be >= 1, got {xrange}")
        xrange = min(xrange, n)
        rows = [list(range(r, min(r + xrange, n))) for r in range(0, n, xrange)]
        cols = [list(range(c, n, xrange)) for c in range(xrange)]
        xconf, yconf = _config(xaxis_config or {}), _config(yaxis_config or {})
        x, y = ts.split([rows, cols])
        return (Team._make("split", x, xconf) if x else TEAM_INVALID,
                Team._make("split", y, yconf) if y else TEAM_INVALID)

    def create_ctx(self, options: int = 0) -> Any:
        """A communication context on this team (team-relative PE numbers)."""
        return Ctx.create(options, self)

    def destroy(self) -> None:
        """Collective over the team: release it, and the contexts made from it (OpenSHMEM
        1.6); this handle becomes ``TEAM_INVALID``. ``TEAM_WORLD``, ``TEAM_SHARED`` and
        ``TEAM_INVALID`` are never released (an alias of them is only invalidated)."""
        if self is TEAM_WORLD or self is TEAM_SHARED or self is TEAM_INVALID:
            return
        kind, ts = self._kind, self._ts
        self._kind, self._ts, self._config = "invalid", None, {}
        if kind == "split" and ts is not None and not ts.destroyed:
            close_team_contexts(ts)
            ts.destroy()


def _config(conf: Mapping[str, int]) -> dict[str, int]:
    """A team configuration (``num_contexts``, any case), checked."""
    out: dict[str, int] = {}
    for key, value in conf.items():
        name = str(key).lower()
        if name != "num_contexts":
            raise InvalidArgumentError(f"unknown team configuration {key!r}: the one "
                                       "parameter is 'num_contexts'")
        out[name] = int(value)
    return out


TEAM_WORLD = Team._make("world", None, {})
TEAM_SHARED = Team._make("shared", None, {})
TEAM_INVALID = Team._make("invalid", None, {})
_ctx.world_team = TEAM_WORLD


def _state_of(team: Any, what: str) -> TeamState:
    """``team``'s core state (TEAM_INVALID and destroyed teams raise), or an error naming a
    ``team`` that is not a Team at all."""
    if not isinstance(team, Team):
        raise InvalidTypeError(f"{what}: team must be a shmem.Team, got {type(team).__name__}")
    return team.state


def sync(team: Team | None = None, *, stream: Any = None) -> None:
    """Collective over ``team`` (default: every PE): wait until all members arrive (with
    ``stream``: see ``Team.sync``)."""
    ts = _state_of(TEAM_WORLD if team is None else team, "sync")  # TEAM_INVALID raises
    if stream is not None and _streamcoll.team_sync(ts, stream):
        return
    ts.sync()


sync = entry("sync", sync)  # TEAM_WORLD of shm peers: in C (vkshmem.core.fast)


def team_ptr(team: Team, dest: np.ndarray, pe: int) -> np.ndarray | None:
    """``ptr`` with ``pe`` numbered within ``team``."""
    ts = _state_of(team, "team_ptr")
    try:
        pe = operator.index(pe)
    except TypeError:
        raise InvalidTypeError(f"team_ptr: PE must be an integer, got {pe!r}") from None
    if not 0 <= pe < ts.size:
        raise InvalidArgumentError(f"PE {pe} is not in this team of {ts.size} PEs")
    return ptr(dest, ts.pes[pe])
