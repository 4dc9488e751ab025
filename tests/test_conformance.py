"""shmem4py 1.0 / OpenSHMEM 1.6 conformance: docs/conformance.md covers every public name of
shmem4py.shmem 1.0 and of vkshmem.shmem, vkshmem has each one, and the rules that need no
running job (exception types, handle protocol, session and pcontrol arguments, constants).
The multi-PE edge cases are tests/pe/conform_mem.py and tests/pe/conform_handles.py
(tests/test_multipe_spec.py runs them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vkshmem import InvalidArgumentError, InvalidTypeError, NotAllocatedError, VkshmemError
from vkshmem._api import ctx as _ctx
from vkshmem._api import lifecycle, team
from vkshmem._api.alloc import free
from vkshmem._api.compat import lib
from vkshmem._api.enums import CMP, CTX, CTX_SESSION, THREAD

ROOT = Path(__file__).parent.parent
DOC = ROOT / "docs" / "conformance.md"

#: The public names of shmem4py 1.0's ``shmem`` module (from its source: every module-level
#: name without a leading underscore, ``sys`` excepted, which it deletes).
SHMEM4PY = """
np ffi lib MAJOR_VERSION MINOR_VERSION VENDOR_STRING info_get_version info_get_name THREAD
THREAD_SINGLE THREAD_FUNNELED THREAD_SERIALIZED THREAD_MULTIPLE init finalize global_exit
init_thread query_thread CTX CTX_PRIVATE CTX_SERIALIZED CTX_NOSTORE Ctx CTX_DEFAULT CTX_INVALID
Team TEAM_WORLD TEAM_SHARED TEAM_INVALID my_pe n_pes pe_accessible addr_accessible ptr MALLOC
MALLOC_ATOMICS_REMOTE MALLOC_SIGNAL_REMOTE alloc free fromalloc new_array del_array array empty
zeros ones full put get iput iget put_nbi get_nbi atomic_set atomic_inc atomic_add atomic_and
atomic_or atomic_xor atomic_fetch atomic_swap atomic_compare_swap atomic_fetch_inc
atomic_fetch_add atomic_fetch_and atomic_fetch_or atomic_fetch_xor atomic_fetch_nbi
atomic_swap_nbi atomic_compare_swap_nbi atomic_fetch_inc_nbi atomic_fetch_add_nbi
atomic_fetch_and_nbi atomic_fetch_or_nbi atomic_fetch_xor_nbi AMO AMO_SET AMO_INC AMO_ADD AMO_AND
AMO_OR AMO_XOR atomic_op atomic_fetch_op atomic_fetch_op_nbi new_signal del_signal signal_fetch
SIGNAL SIGNAL_SET SIGNAL_ADD put_signal put_signal_nbi barrier_all sync_all sync broadcast
collect fcollect alltoall alltoalls OP OP_AND OP_OR OP_XOR OP_MAX OP_MIN OP_SUM OP_PROD reduce
and_reduce or_reduce xor_reduce max_reduce min_reduce sum_reduce prod_reduce CMP CMP_EQ CMP_NE
CMP_GT CMP_LE CMP_LT CMP_GE wait_until wait_until_all wait_until_any wait_until_some
wait_until_all_vector wait_until_any_vector wait_until_some_vector test test_all test_any
test_some test_all_vector test_any_vector test_some_vector signal_wait_until fence quiet new_lock
del_lock set_lock test_lock clear_lock Lock pcontrol
""".split()


def _documented() -> dict[str, str]:
    """Names in the first column of the doc's tables -> the row's test column."""
    rows: dict[str, str] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 5 or set(cells[0]) <= {"-", " "}:
            continue
        for name in re.findall(r"`([A-Za-z_][\w.]*)", cells[0]):
            rows[name] = cells[4]
    return rows


@pytest.fixture(scope="module")
def vkshmem_names() -> dict[str, list[str]]:
    """``vkshmem.shmem``'s ``__all__`` and attributes, imported without starting a job."""
    code = ("import json; from vkshmem import shmem; "
            "print(json.dumps({'all': shmem.__all__, 'dir': dir(shmem)}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "VKSHMEM_AUTO_INIT": "0"}, timeout=120, check=True)
    return json.loads(out.stdout)


def test_vkshmem_has_every_shmem4py_name(vkshmem_names: dict[str, list[str]]) -> None:
    assert len(SHMEM4PY) == len(set(SHMEM4PY)) == 148
    missing = [name for name in SHMEM4PY if name not in vkshmem_names["dir"]]
    assert missing == []


def test_every_name_has_a_row_with_tests(vkshmem_names: dict[str, list[str]]) -> None:
    rows = _documented()
    undocumented = sorted((set(SHMEM4PY) | set(vkshmem_names["all"])) - set(rows))
    assert undocumented == []
    for name, tests in rows.items():
        paths = re.findall(r"tests/[\w/]+\.py", tests)
        assert paths or "—" in tests, f"{name}: no test named in {tests!r}"
        for path in paths:
            assert (ROOT / path).is_file(), f"{name}: {path} does not exist"


def test_error_types_catch_as_shmem4py_expects() -> None:
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(InvalidArgumentError, RuntimeError)
    assert issubclass(InvalidTypeError, TypeError) and issubclass(InvalidTypeError,
                                                                   InvalidArgumentError)
    assert issubclass(NotAllocatedError, KeyError) and issubclass(NotAllocatedError, VkshmemError)
    # KeyError quotes its argument; the message stays readable
    assert str(NotAllocatedError("free: no live allocation")) == "free: no live allocation"


def test_free_of_none_does_nothing() -> None:
    free(None)  # no runtime is running here: it must not even look for one


def test_handles_without_a_job() -> None:
    D, CI = _ctx.CTX_DEFAULT, _ctx.CTX_INVALID
    W, INV = team.TEAM_WORLD, team.TEAM_INVALID
    assert _ctx.Ctx() == CI and not CI and D and not (CI == 0)
    with pytest.raises(TypeError):
        _ctx.Ctx(0)
    CI.fence()  # OpenSHMEM 1.6: no operation on CTX_INVALID
    CI.quiet()
    CI.destroy()
    with pytest.raises(RuntimeError, match="CTX_INVALID"):
        CI.get_team()
    alias = _ctx.Ctx(D)
    assert alias == D and alias is not D
    alias.destroy()
    assert not alias and alias == CI and D and D == _ctx.Ctx(D)
    t = team.Team(W)
    t.destroy()
    assert not t and t == INV and W and team.Team() == INV
    for predefined in (W, team.TEAM_SHARED, INV):
        predefined.destroy()
    assert W and team.TEAM_SHARED and not INV
    with pytest.raises(RuntimeError, match="TEAM_INVALID"):
        INV.n_pes()


def test_session_arguments() -> None:
    CI = _ctx.CTX_INVALID
    _ctx.ctx_session_start(CI, CTX_SESSION.BATCH, {"TOTAL_OPS": 3})  # no operation
    _ctx.ctx_session_stop(CI)
    assert CI.session is None
    with pytest.raises(ValueError, match="unknown session options"):
        _ctx.ctx_session_start(CI, 2)
    with pytest.raises(ValueError, match="total_ops"):
        _ctx.ctx_session_start(CI, 0, batch_size=3)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        _ctx.ctx_session_start(CI, 0, total_ops=2**64)
    with pytest.raises(TypeError):
        _ctx.ctx_session_start(CI, 0, total_ops="3")
    with pytest.raises(TypeError):
        _ctx.ctx_session_start(CI, 1.0)


def test_pcontrol_and_version() -> None:
    for level in (1, 2, 0, -1, 7, True):
        assert lifecycle.pcontrol(level) is None
    with pytest.raises(TypeError):
        lifecycle.pcontrol(1.5)
    assert lifecycle.info_get_version() == (1, 6)
    assert (lifecycle.MAJOR_VERSION, lifecycle.MINOR_VERSION) == (1, 6)
    assert not lifecycle.query_initialized()


def test_lib_constants_match_the_enums() -> None:
    assert lib.SHMEM_TEAM_NUM_CONTEXTS == 1 and lib.SHMEM_CTX_SESSION_TOTAL_OPS == 1
    assert lib.SHMEM_MAJOR_VERSION == 1 and lib.SHMEM_MINOR_VERSION == 6
    assert [lib.SHMEM_CMP_EQ, lib.SHMEM_CMP_GE] == [CMP.EQ, CMP.GE]
    assert lib.SHMEM_CTX_NOSTORE == CTX.NOSTORE and lib.SHMEM_CTX_SESSION_BATCH == 1
    assert lib.SHMEM_THREAD_MULTIPLE == THREAD.MULTIPLE
    assert lib.SHMEM_TEAM_WORLD is team.TEAM_WORLD and lib.SHMEM_CTX_INVALID is _ctx.CTX_INVALID
    with pytest.raises(AttributeError, match="no C OpenSHMEM library"):
        lib.shmem_put  # noqa: B018
