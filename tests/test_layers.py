"""The package's layers (docs/architecture.md): each imports only the layers below it, and no modules
import each other in a cycle. grimp reads every import statement of src/gufo (those under
`if TYPE_CHECKING:` too: a type a layer names is a dependency on the layer that defines it)."""

from __future__ import annotations

import grimp
import pytest

# highest first; the packages of one layer may import each other (they must not form a cycle)
LAYERS = (
    ("gufo.cli",),
    ("gufo.parallel", "gufo.server", "gufo.tools"),
    ("gufo.engine",),
    ("gufo.models",),
    ("gufo.kernels",),
    ("gufo.gguf", "gufo.formats", "gufo.tokenizer"),
    ("gufo.errors", "gufo.options"),
)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("gufo", exclude_type_checking_imports=False)


def test_every_module_belongs_to_a_layer(graph):
    packages = {name for layer in LAYERS for name in layer}
    unplaced = sorted(
        module
        for module in graph.modules
        if module != "gufo" and not any(module == p or module.startswith(p + ".") for p in packages)
    )
    assert unplaced == []


def test_imports_point_down_only(graph):
    layers = [grimp.Layer(*names, independent=False) for names in LAYERS]
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers)
    found = sorted(
        f"{dep.importer} -> {dep.imported}: "
        + "; ".join(
            " -> ".join([",".join(sorted(r.heads)), *r.middle, ",".join(sorted(r.tails))]) for r in dep.routes
        )
        for dep in illegal
    )
    assert found == []


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_the_checks_see_a_planted_cycle_and_an_upward_import(graph):
    """The checks fail where they should: an import from kernels up into models, and back."""
    graph.add_import(importer="gufo.kernels.registry", imported="gufo.models.base")
    try:
        assert graph.chain_exists("gufo.models.base", "gufo.kernels.registry")  # models use the registry
        assert any({"gufo.kernels.registry", "gufo.models.base"} <= set(c) for c in cycles(graph))
        layers = [grimp.Layer(*names, independent=False) for names in LAYERS]
        illegal = graph.find_illegal_dependencies_for_layers(layers=layers)
        assert any(d.importer == "gufo.kernels" and d.imported == "gufo.models" for d in illegal)
    finally:
        graph.remove_import(importer="gufo.kernels.registry", imported="gufo.models.base")
