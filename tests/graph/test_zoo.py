"""zoo: real architectures with seeded random weights, so a wrong split cannot "match" by accident."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from splitrt.errors import ModelError
from splitrt.graph import zoo
from tests.conftest import session


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("resnet50", marks=pytest.mark.slow),
        "inception_v1",
        "squeezenet",
        pytest.param("densenet121", marks=pytest.mark.slow),
        "branchy",
        "mobilenetv2",
    ],
)
def test_weights_are_random_and_outputs_depend_on_the_input(name: str) -> None:
    p = zoo.get(name)
    m = onnx.load(str(p))
    assert not any(n.op_type == "ConstantOfShape" for n in m.graph.node)
    big = [numpy_helper.to_array(t) for t in m.graph.initializer if np.prod(t.dims) > 100]
    assert big and all(np.std(w) > 0 for w in big)
    s = session(p)
    a = s.run(None, zoo.random_inputs(p, seed=1))[0]
    b = s.run(None, zoo.random_inputs(p, seed=2))[0]
    assert np.all(np.isfinite(a)) and np.std(a) > 0
    assert not np.allclose(a, b)


def test_builds_are_deterministic(tmp_path: object) -> None:
    assert zoo.build("squeezenet").SerializeToString() == zoo.build("squeezenet").SerializeToString()


def test_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(ModelError, match="unknown zoo model 'lenet'; expected one of"):
        zoo.get("lenet")


def test_resolve_accepts_path_prefix_and_bare_name(tmp_path: object) -> None:
    assert zoo.resolve("zoo:tiny_chain") == zoo.resolve("tiny_chain") == zoo.get("tiny_chain")
    assert str(zoo.resolve("/no/such/model.onnx")) == "/no/such/model.onnx"


def test_mobilenetv2_has_the_published_structure() -> None:
    m = zoo.build("mobilenetv2")
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    depthwise = [n for n in convs if any(a.name == "group" and a.i > 1 for a in n.attribute)]
    # stem + 17 blocks (16 expanding) x (expand, depthwise, project) + the 1x1 head conv
    assert (len(convs), len(depthwise)) == (1 + 16 * 3 + 2 + 1, 17)
    assert sum(n.op_type == "Add" for n in m.graph.node) == 10  # the stride-1 blocks of equal width
    params = sum(int(np.prod(t.dims)) for t in m.graph.initializer)
    assert 3.4e6 < params < 3.6e6
