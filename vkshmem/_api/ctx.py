"""Communication contexts: ``Ctx.create(options, team)``, ``CTX_DEFAULT``, ``CTX_INVALID``, and
OpenSHMEM 1.6 sessions (``ctx_session_start``/``ctx_session_stop``).

A context owns its own endpoint on every transport (``Transport.create_context``), so its
``fence``/``quiet`` order and complete only its own operations. A context made from a team
takes team-relative PE numbers.

Handles behave as shmem4py's: ``Ctx(other)`` is an alias of ``other``; ``destroy()`` makes the
handle it is called on ``CTX_INVALID`` (falsy, equal to ``CTX_INVALID``), destroying an alias
of ``CTX_DEFAULT`` invalidates only the alias, and ``CTX_DEFAULT``/``CTX_INVALID`` themselves
never change. Other aliases of a destroyed context keep their (stale) handle, as in shmem4py;
using one for communication raises an error naming the destroyed context (C: undefined).
On ``CTX_INVALID``, ``fence``, ``quiet``, ``destroy`` and the session calls do nothing
(OpenSHMEM 1.6); ``get_team`` raises (shmem4py's RuntimeError, C's nonzero return).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from ..core._native import lib
from ..core.errors import InvalidArgumentError, InvalidTypeError
from ..core.transports.contract import Transport
from . import state
from .args import check_pe
from .enums import CTX, CTX_SESSION

#: ``TEAM_WORLD``: the team of the default context and of contexts made without one. Set by
#: :mod:`.team` (which builds on this module) when it defines the predefined teams.
world_team: Any = None

__all__ = ["CTX_DEFAULT", "CTX_INVALID", "Ctx", "ctx_session_start", "ctx_session_stop"]

#: ``total_ops`` when a session's config does not give it (C's ``SIZE_MAX``).
SESSION_TOTAL_OPS_DEFAULT = (1 << 64) - 1

_DESTROYED = ("this context was destroyed (through another handle of it, or with the team it "
              "was made from)")
_INVALID = "CTX_INVALID (or a destroyed context) cannot be used for communication"


class Ctx:
    """A communication context. ``Ctx(other)`` is an alias of ``other``."""

    _kind: str  # "default", "created", "invalid"
    _body: _Body | None

    def __new__(cls, ctx: Ctx | None = None) -> Ctx:
        self = super().__new__(cls)
        if isinstance(ctx, Ctx):
            self._kind, self._body = ctx._kind, ctx._body
        elif ctx is None:
            self._kind, self._body = "invalid", None
        else:
            raise TypeError(f"Ctx() takes a Ctx, got {type(ctx).__name__}")
        return self

    @classmethod
    def _make(cls, kind: str, body: _Body | None) -> Ctx:
        self = super().__new__(cls)
        self._kind, self._body = kind, body
        return self

    @staticmethod
    def create(options: int = 0, team: Any = None) -> Ctx:
        """A new context (on ``team``, default the world) with ``CTX`` option flags. Not
        collective. Raises (a RuntimeError) for ``TEAM_INVALID``."""
        options = int(options)
        if options & ~int(CTX.PRIVATE | CTX.SERIALIZED | CTX.NOSTORE):
            raise InvalidArgumentError(f"unknown context options {options:#x}")
        team = world_team if team is None else team
        return Ctx._make("created", _Body(team, options))

    def target(self, pe: Any) -> tuple[int, Transport]:
        """(world PE, endpoint) for ``pe`` in this context."""
        body = self._body
        if body is None:
            if self._kind == "default":
                pe = check_pe(pe)
                return pe, state.route_transport[pe]
            raise InvalidArgumentError(_INVALID)
        return body.target(pe)

    def get_team(self) -> Any:
        """A handle of the team the context was made from (``TEAM_WORLD`` for
        ``CTX_DEFAULT`` and contexts of ``Ctx.create()`` without a team)."""
        body = self._body
        if body is not None:
            if body.closed:
                raise InvalidArgumentError(_DESTROYED)
            return type(world_team)(body.team)
        if self._kind == "default":
            return type(world_team)(world_team)
        raise InvalidArgumentError("CTX_INVALID has no team (shmem_ctx_get_team fails on it)")

    def fence(self) -> None:
        """Order this context's operations to each PE (nothing on ``CTX_INVALID``)."""
        if self._body is not None:
            self._body.fence()
        elif self._kind == "default":
            state.rt.fence()

    def quiet(self) -> None:
        """Complete every operation issued on this context, and only those (nothing on
        ``CTX_INVALID``)."""
        if self._body is not None:
            self._body.quiet()
        elif self._kind == "default":
            state.rt.quiet()

    def destroy(self) -> None:
        """Complete and release the context; this handle becomes ``CTX_INVALID``.
        ``CTX_DEFAULT`` and ``CTX_INVALID`` are never released. Not collective."""
        if self is CTX_DEFAULT or self is CTX_INVALID:
            return
        body = self._body
        self._kind, self._body = "invalid", None
        if body is not None:
            body.close()

    # -- OpenSHMEM 1.6 sessions ----------------------------------------------------------------

    def session_start(self, options: int = 0, config: Mapping[str, int] | None = None,
                      **kwargs: int) -> None:
        """Start a session on this context, or add to the one started (``options`` are OR-ed
        in, ``config`` values replace earlier ones). Not collective.

        ``options``: ``CTX_SESSION`` flags (``CTX_SESSION.BATCH``); ``config`` (or keyword
        arguments): ``total_ops``, the expected number of RMA calls in the session (default
        ``2**64 - 1``, C's ``SIZE_MAX``: not given). Sessions are hints: vkshmem applies no
        batching yet, and completion and ordering are unchanged. Nothing on ``CTX_INVALID``.
        """
        opts = _session_options(options)
        conf = _session_config(config, kwargs)
        holder = self._session_holder("ctx_session_start")
        if holder is None:
            return
        old = holder.session
        if old is None:
            holder.session = {"options": CTX_SESSION(opts),
                              "total_ops": SESSION_TOTAL_OPS_DEFAULT, **conf}
        else:
            holder.session = {**old, "options": CTX_SESSION(int(old["options"]) | opts),
                              **conf}

    def session_stop(self) -> None:
        """End the session on this context (nothing if none is started, or on
        ``CTX_INVALID``). Not collective; completes nothing by itself (use ``quiet``)."""
        holder = self._session_holder("ctx_session_stop")
        if holder is not None:
            holder.session = None

    @property
    def session(self) -> dict[str, Any] | None:
        """The session in effect on this context (``{'options': CTX_SESSION,
        'total_ops': int}``), or None (a vkshmem extension, for inspection)."""
        holder = self._session_holder("session")
        return None if holder is None or holder.session is None else dict(holder.session)

    def _session_holder(self, what: str) -> Any:
        if self._body is not None:
            if self._body.closed:
                raise InvalidArgumentError(f"{what}: {_DESTROYED}")
            return self._body
        return _DEFAULT_SESSION if self._kind == "default" else None

    # -- handle protocol ---------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ctx):
            return NotImplemented
        return self._kind == other._kind and self._body is other._body

    def __hash__(self) -> int:
        return hash((self._kind, id(self._body)))

    def __bool__(self) -> bool:
        return self._kind != "invalid"

    def __enter__(self) -> Ctx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        stale = " destroyed" if self._body is not None and self._body.closed else ""
        return f"Ctx({self._kind}{stale})"


class _SessionBox:
    """Where the default context keeps its session (created contexts keep theirs on _Body)."""

    session: dict[str, Any] | None = None


_DEFAULT_SESSION = _SessionBox()


def reset_default_session() -> None:
    """Forget the default context's session (the runtime was finalized)."""
    _DEFAULT_SESSION.session = None


def _session_options(options: Any) -> int:
    try:
        opts = int(options.__index__())
    except AttributeError:
        raise InvalidTypeError(f"session options must be CTX_SESSION flags, got {options!r}") \
            from None
    if opts & ~int(CTX_SESSION.BATCH):
        raise InvalidArgumentError(f"unknown session options {opts:#x}: use "
                                   "shmem.CTX_SESSION_BATCH (or 0)")
    return opts


def _session_config(config: Mapping[str, int] | None, kwargs: Mapping[str, int]) -> dict:
    conf: dict[str, int] = {}
    for key, value in {**(config or {}), **kwargs}.items():
        name = str(key).lower()
        if name != "total_ops":
            raise InvalidArgumentError(f"unknown session configuration {key!r}: the one "
                                       "parameter is 'total_ops'")
        try:
            total = int(value.__index__())
        except AttributeError:
            raise InvalidTypeError(f"total_ops must be an integer, got {value!r}") from None
        if not 0 <= total <= SESSION_TOTAL_OPS_DEFAULT:
            raise InvalidArgumentError(f"total_ops must be in [0, 2**64), got {total}")
        conf[name] = total
    return conf


def ctx_session_start(ctx: Ctx | None = None, options: int = 0,
                      config: Mapping[str, int] | None = None, **kwargs: int) -> None:
    """OpenSHMEM 1.6 ``shmem_ctx_session_start`` on ``ctx`` (default: ``CTX_DEFAULT``); see
    :meth:`Ctx.session_start`. Not collective."""
    if ctx is None:  # CTX_INVALID's session calls do nothing, with or without a runtime
        state.require()
    (CTX_DEFAULT if ctx is None else ctx).session_start(options, config, **kwargs)


def ctx_session_stop(ctx: Ctx | None = None) -> None:
    """OpenSHMEM 1.6 ``shmem_ctx_session_stop`` on ``ctx`` (default: ``CTX_DEFAULT``).
    Not collective."""
    if ctx is None:
        state.require()
    (CTX_DEFAULT if ctx is None else ctx).session_stop()


# Created contexts by the team they were made from: destroying a team destroys them (1.6).
_BY_TEAM: weakref.WeakKeyDictionary[Any, weakref.WeakSet[_Body]] = weakref.WeakKeyDictionary()


def close_team_contexts(team_state: Any) -> None:
    """Destroy every context made from the team whose core state is ``team_state``."""
    for body in list(_BY_TEAM.pop(team_state, ())):
        body.close()


class _Body:
    """The endpoints of one created context."""

    def __init__(self, team: Any, options: int) -> None:
        ts = team.state
        rt = state.rt
        self.team = team
        self.options = options
        self.size = ts.size
        self.pes = ts.pes
        self.closed = False
        self.session: dict[str, Any] | None = None
        mapping: dict[int, Transport] = {}
        self.owned: list[tuple[Transport, Transport]] = []  # (parent, endpoint)
        for t in rt.routing.transports:
            ep = t.create_context()
            mapping[id(t)] = ep
            self.owned.append((t, ep))
        self.eps = [mapping.get(id(t), t) for t in ts.routes]
        _BY_TEAM.setdefault(ts, weakref.WeakSet()).add(self)

    def target(self, pe: Any) -> tuple[int, Transport]:
        if type(pe) is not int:
            try:
                pe = int(pe.__index__())
            except AttributeError:
                raise InvalidTypeError(f"PE must be an integer, got {pe!r}") from None
        if 0 <= pe < self.size:
            return self.pes[pe], self.eps[pe]
        if self.closed:
            raise InvalidArgumentError(_DESTROYED)
        raise InvalidArgumentError(f"PE {pe} does not exist in this context's team of "
                                   f"{self.size} PEs")

    def fence(self) -> None:
        lib.vk_fence()
        for _parent, ep in self.owned:
            if ep.spec.native_fence:
                ep.fence()
            else:
                ep.quiet()

    def quiet(self) -> None:
        lib.vk_fence()
        for _parent, ep in self.owned:
            ep.quiet()

    def close(self) -> None:
        """Quiet, then release the endpoints; later use through any handle is refused."""
        if self.closed:
            return
        self.quiet()
        for parent, ep in self.owned:
            if ep is not parent:
                ep.close()
        self.owned.clear()
        self.closed = True
        self.size = 0  # target() now takes its error branch, which names the cause
        self.session = None


CTX_DEFAULT = Ctx._make("default", None)
CTX_INVALID = Ctx._make("invalid", None)
