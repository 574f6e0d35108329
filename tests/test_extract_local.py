"""Extraction's local search (`engine.extract._LocalSearch`): the DAG cost it keeps by
reference counts, and its return to the input's e-nodes where the greedy tree-cost choice
undid the input's sharing (GPT-2: a scale pushed above a Reshape/Transpose chain that a Shape
also reads, so the chain was computed twice)."""

from types import SimpleNamespace

from engine.extract import _dag_cost, _LocalSearch


def _costs(enodes, own):
    """A stand-in for `_Costs`: enodes as (class, op, kid classes), own cost per e-node."""
    return SimpleNamespace(
        enodes=[(c, SimpleNamespace(op=op)) for c, op, _ in enodes],
        kids=[tuple(k) for _, _, k in enodes],
        own=list(own),
        group=[-1] * len(enodes),
    )


# classes: 0 = x (leaf), 1 = t = Transpose(x), 2 = Shape(t), 3 = y = t * 2 (input) or
# Transpose(x * 2) (rewritten), 4 = x * 2
ENODES = [
    (0, "Leaf", ()),
    (1, "Transpose", (0,)),
    (2, "Shape", (1,)),
    (3, "Mul", (1,)),  # the input's e-node of y
    (3, "Transpose", (4,)),  # the rewritten one: cheaper as a tree, not as a DAG
    (4, "Mul", (0,)),
]
OWN = [0.0, 2.8, 1.0, 3.0, 2.8, 2.9]
ROOTS = [2, 3]


def test_reverts_to_the_input_where_sharing_is_cheaper():
    costs = _costs(ENODES, OWN)
    greedy = {0: 0, 1: 1, 2: 2, 3: 4, 4: 5}
    own = {0: 0, 1: 1, 2: 2, 3: 3}
    assert _dag_cost(costs, greedy, ROOTS) == 0 + 2.8 + 1 + 2.8 + 2.9
    search = _LocalSearch(costs, greedy, ROOTS)
    assert abs(search.delta - _dag_cost(costs, greedy, ROOTS)) < 1e-9
    choice = search.revert_to(own)
    assert choice[3] == 3
    assert abs(_dag_cost(costs, choice, ROOTS) - (0 + 2.8 + 1 + 3.0)) < 1e-9
    assert abs(search.delta - _dag_cost(costs, choice, ROOTS)) < 1e-9  # counts stay exact


def test_keeps_a_rewrite_that_is_cheaper_as_a_dag():
    own_costs = list(OWN)
    own_costs[3] = 9.0  # the input's Mul is now dearer than the duplicated chain
    costs = _costs(ENODES, own_costs)
    greedy = {0: 0, 1: 1, 2: 2, 3: 4, 4: 5}
    choice = _LocalSearch(costs, greedy, ROOTS).revert_to({0: 0, 1: 1, 2: 2, 3: 3})
    assert choice == greedy


def test_never_makes_a_cycle():
    # class 1 = Relu(x) in the input; after a rewrite class 0 (the root) is also
    # Neg(Neg(class 0))... a change that would read its own class is never tried
    enodes = [
        (0, "Relu", (2,)),  # chosen
        (0, "Neg", (1,)),  # the "input" e-node: reads class 1, which reads class 0
        (1, "Neg", (0,)),
        (2, "Leaf", ()),
    ]
    costs = _costs(enodes, [5.0, 0.1, 0.1, 0.0])
    choice = _LocalSearch(costs, {0: 0, 1: 2, 2: 3}, [0]).revert_to({0: 1})
    assert choice[0] == 0
