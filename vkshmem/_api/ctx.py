"""Communication contexts: ``Ctx.create(options, team)``, ``CTX_DEFAULT``, ``CTX_INVALID``.

A context owns its own endpoint on every transport (``Transport.create_context``), so its
``fence``/``quiet`` order and complete only its own operations. A context made from a team
takes team-relative PE numbers.
"""

from __future__ import annotations

from typing import Any

from ..core._native import lib
from ..core.errors import InvalidArgumentError
from ..core.transport import Transport
from . import state
from .args import check_pe
from .enums import CTX

__all__ = ["CTX_DEFAULT", "CTX_INVALID", "Ctx"]


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
        """A new context (on ``team``, default the world) with ``CTX`` option flags."""
        from .team import TEAM_WORLD

        options = int(options)
        if options & ~int(CTX.PRIVATE | CTX.SERIALIZED | CTX.NOSTORE):
            raise InvalidArgumentError(f"unknown context options {options:#x}")
        team = TEAM_WORLD if team is None else team
        return Ctx._make("created", _Body(team, options))

    def target(self, pe: Any) -> tuple[int, Transport]:
        """(world PE, endpoint) for ``pe`` in this context."""
        body = self._body
        if body is None:
            if self._kind == "default":
                pe = check_pe(pe)
                return pe, state.rt.route_transport[pe]
            raise InvalidArgumentError("CTX_INVALID (or a destroyed context) cannot be used")
        return body.target(pe)

    def get_team(self) -> Any:
        """The team the context was made from."""
        from .team import TEAM_INVALID, TEAM_WORLD

        if self._body is not None:
            return self._body.team
        return TEAM_WORLD if self._kind == "default" else TEAM_INVALID

    def fence(self) -> None:
        """Order this context's operations to each PE."""
        if self._body is None:
            self._check_default()
            state.rt.fence()
        else:
            self._body.fence()

    def quiet(self) -> None:
        """Complete every operation issued on this context (and only those)."""
        if self._body is None:
            self._check_default()
            state.rt.quiet()
        else:
            self._body.quiet()

    def destroy(self) -> None:
        """Complete and release the context (CTX_DEFAULT is never released)."""
        body = self._body
        if body is not None:
            self._body = None
            self._kind = "invalid"
            body.close()

    def _check_default(self) -> None:
        if self._kind != "default":
            raise InvalidArgumentError("CTX_INVALID (or a destroyed context) cannot be used")

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
        return f"Ctx({self._kind})"


class _Body:
    """The endpoints of one created context."""

    def __init__(self, team: Any, options: int) -> None:
        ts = team.state
        rt = state.rt
        self.team = team
        self.options = options
        self.size = ts.size
        self.pes = ts.pes
        mapping: dict[int, Transport] = {}
        self.owned: list[tuple[Transport, Transport]] = []  # (parent, endpoint)
        for t in rt.transports:
            ep = t.create_context()
            mapping[id(t)] = ep
            self.owned.append((t, ep))
        self.eps = [mapping.get(id(t), t) for t in ts.routes]

    def target(self, pe: Any) -> tuple[int, Transport]:
        if type(pe) is not int:
            pe = int(pe.__index__())
        if 0 <= pe < self.size:
            return self.pes[pe], self.eps[pe]
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
        self.quiet()
        for parent, ep in self.owned:
            if ep is not parent:
                ep.close()
        self.owned.clear()


CTX_DEFAULT = Ctx._make("default", None)
CTX_INVALID = Ctx._make("invalid", None)
