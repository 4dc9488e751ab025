"""The package's structure: no import circles among its modules, and a core that imports no
plugin (neither the Vulkan domain nor any transport), so that a memory domain or a transport
can be added without touching it."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).parent.parent / "vkshmem"


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """Modules of vkshmem that ``path`` imports (at module level when ``top_level_only``:
    not inside functions or ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    here = _module(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[:len(up) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
            elif not top_level_only or isinstance(node, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        visit([n for n in inner if isinstance(n, ast.stmt)] +
                              [s for h in inner if isinstance(h, ast.ExceptHandler)
                               for s in h.body])

    visit(tree.body)
    return {m for m in found if m == "vkshmem" or m.startswith("vkshmem.")}


FILES = {_module(p): p for p in PKG.rglob("*.py")}


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    return {m: {i for i in _imports(p, top_level_only) if i in FILES and i != m}
            for m, p in FILES.items()}


def test_no_import_circles() -> None:
    """Counting imports inside functions too: a function-level import hides a circle, it does
    not remove it."""
    graph = _graph(top_level_only=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    assert not circles, f"modules that import each other: {circles}"


def test_core_imports_no_plugin() -> None:
    for module, path in FILES.items():
        if module.startswith("vkshmem.core"):
            bad = {m for m in _imports(path, top_level_only=False)
                   if not m.startswith("vkshmem.core")}
            assert not bad, f"{module} imports {sorted(bad)} (the core must import no plugin)"


#: what CUDA code under vkshmem/ would import, load or call (vkshmem-cuda, plugins/cuda, holds
#: all of it: the Vulkan domain's NVIDIA accelerations attach through vkshmem.gpu.accel)
_CUDA_MODULES = ("cuda", "cupy", "pycuda", "vkshmem_cuda", "numba.cuda", "torch.cuda")
_CUDA_C = (r'#\s*include\s*[<"](cuda|cuda_runtime|nvrtc)[\w.]*[>"]|\bcu[A-Z]\w*\s*\('
           r'|libcuda|libnvrtc')


def test_no_cuda_code_in_vkshmem() -> None:
    """One home per vendor: no module of vkshmem imports (or loads by name) CUDA or
    vkshmem-cuda, no file is named cuda*, and no C file includes CUDA's headers or calls its
    driver (documentation strings may name CUDA)."""
    import re

    def imported(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            return [node.module]
        if isinstance(node, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            name = ast.unparse(node.func)
            if name.endswith(("import_module", "find_spec", "__import__", "CDLL", "dlopen",
                              "LoadLibrary")):
                return [node.args[0].value]
        return []

    bad: list[str] = []
    for path in sorted(PKG.rglob("*")):
        rel = path.relative_to(PKG.parent)
        if "cuda" in path.name.lower() and path.name != "__pycache__":
            bad.append(f"{rel}: named after CUDA")
        if path.suffix == ".py":
            for node in ast.walk(ast.parse(path.read_text())):
                for name in imported(node):
                    top = name.split(".")
                    if any(top[:len(m.split("."))] == m.split(".") for m in _CUDA_MODULES) or \
                            "libcuda" in name or "nvrtc" in name:
                        bad.append(f"{rel}:{node.lineno}: loads {name}")  # type: ignore[attr-defined]
        elif path.suffix in (".c", ".h", ".cu", ".cuh", ".cpp"):
            text = re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(), flags=re.S)
            bad.extend(f"{rel}: {m.group(0).strip()}" for m in re.finditer(_CUDA_C, text))
    assert not bad, "CUDA code in vkshmem (it belongs in plugins/cuda):\n" + "\n".join(bad)


def test_runtime_and_domain_heap_are_composed_of_parts() -> None:
    """The runtime owns its parts (routing, domains, host heap) and a domain heap its device
    transfers: plain classes given what they read, no mixin bases (issue 37)."""
    from vkshmem.core.domains.heap import DomainHeap
    from vkshmem.core.domains.registry import MemoryDomains
    from vkshmem.core.domains.xfer import DeviceTransfers
    from vkshmem.core.hostalloc import HostHeap
    from vkshmem.core.runtime import Runtime
    from vkshmem.core.transports.rails import TransportRoutes

    for cls in (Runtime, TransportRoutes, MemoryDomains, HostHeap, DomainHeap, DeviceTransfers):
        assert cls.__bases__ == (object,), f"{cls.__name__} derives from {cls.__bases__}"
