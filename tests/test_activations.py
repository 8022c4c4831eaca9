"""Activation strings: parsing, normalisation, values against hand-computed numbers, errors."""
from __future__ import annotations

import math

import pytest
import torch

from gru4rec.config.activations import (
    FINAL_ACTIVATIONS,
    HIDDEN_ACTIVATIONS,
    Activation,
    parse_activation,
)

X = [-2.0, -0.5, 0.0, 1.5]


def values(spec: str, xs: list[float] = X) -> list[float]:
    out = parse_activation(spec)(torch.tensor(xs, dtype=torch.float64))
    return out.tolist()


@pytest.mark.parametrize(
    ("spec", "name", "params", "normalised"),
    [
        ("tanh", "tanh", (), "tanh"),
        (" Linear ", "linear", (), "linear"),
        ("relu", "relu", (), "relu"),
        ("softmax", "softmax", (), "softmax"),
        ("softmax_logit", "softmax_logit", (), "softmax_logit"),
        ("elu-0.5", "elu", (0.5,), "elu-0.5"),
        ("elu-1", "elu", (1.0,), "elu-1"),
        ("elu-1.0", "elu", (1.0,), "elu-1"),
        ("ELU-.25", "elu", (0.25,), "elu-0.25"),
        ("leaky-0.01", "leaky", (0.01,), "leaky-0.01"),
        ("leaky-1e-05", "leaky", (1e-05,), "leaky-1e-05"),
        ("selu-1.0507-1.6733", "selu", (1.0507, 1.6733), "selu-1.0507-1.6733"),
        ("selu-2e-1-3", "selu", (0.2, 3.0), "selu-0.2-3"),
    ],
)
def test_parse_and_normalise(spec: str, name: str, params: tuple[float, ...], normalised: str) -> None:
    act = parse_activation(spec)
    assert (act.name, act.params, act.spec, str(act)) == (name, params, normalised, normalised)
    assert parse_activation(act.spec) == act  # the normalised string reads back the same


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("elu-x", "malformed"),
        ("elu", "needs its parameter"),
        ("elu-", "needs its parameter"),
        ("selu-1", "malformed"),
        ("selu-1-2-3", "malformed"),
        ("elu-1-2", "malformed"),
        ("elu--1", "malformed"),  # no signs: the original split the string on '-'
        ("leaky-inf", "malformed"),
        ("elu-1e999", "finite"),
        ("tanh-1", "takes no parameter"),
        ("sigmoid", "unknown activation"),
        ("", "unknown activation"),
    ],
)
def test_malformed_strings_raise_value_error(spec: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_activation(spec)


def test_non_string_raises_value_error() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        parse_activation(0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be a string"):
        parse_activation(["elu", 1])  # type: ignore[arg-type]


def test_role_name_sets() -> None:
    assert HIDDEN_ACTIVATIONS == {"linear", "relu", "tanh", "leaky", "elu", "selu"}
    assert FINAL_ACTIVATIONS == HIDDEN_ACTIVATIONS | {"softmax", "softmax_logit"}
    assert parse_activation("elu-1").elementwise and not parse_activation("softmax").elementwise


def test_elementwise_values_hand_computed() -> None:
    e2, e05 = math.exp(-2.0), math.exp(-0.5)
    expected = {
        "linear": [-2.0, -0.5, 0.0, 1.5],
        "relu": [0.0, 0.0, 0.0, 1.5],
        "tanh": [math.tanh(-2.0), math.tanh(-0.5), 0.0, math.tanh(1.5)],
        "leaky-0.1": [-0.2, -0.05, 0.0, 1.5],
        "elu-0.5": [0.5 * (e2 - 1), 0.5 * (e05 - 1), 0.0, 1.5],
        "elu-1": [e2 - 1, e05 - 1, 0.0, 1.5],
        "elu-0": [0.0, 0.0, 0.0, 1.5],
        "selu-2-0.5": [2 * 0.5 * (e2 - 1), 2 * 0.5 * (e05 - 1), 0.0, 3.0],
    }
    for spec, want in expected.items():
        assert values(spec) == pytest.approx(want, abs=1e-12), spec


def test_elu_gradient_hand_computed() -> None:
    # d/dx elu-A = 1 for x > 0 and A*exp(x) for x < 0; selu multiplies by S.
    x = torch.tensor([-1.0, 2.0], dtype=torch.float64, requires_grad=True)
    parse_activation("selu-3-0.5")(x).sum().backward()
    assert x.grad is not None
    assert x.grad.tolist() == pytest.approx([3 * 0.5 * math.exp(-1.0), 3.0], abs=1e-12)


def test_softmax_forms_act_on_rows() -> None:
    scores = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, math.log(2.0)]], dtype=torch.float64)
    denominators = [math.e + math.e**2 + math.e**3, 4.0]
    want = [
        [math.e / denominators[0], math.e**2 / denominators[0], math.e**3 / denominators[0]],
        [0.25, 0.25, 0.5],
    ]
    got = parse_activation("softmax")(scores)
    assert got.tolist()[0] == pytest.approx(want[0], abs=1e-12)
    assert got.tolist()[1] == pytest.approx(want[1], abs=1e-12)
    neg_log = parse_activation("softmax_logit")(scores).tolist()
    for row_got, row_want in zip(neg_log, want):
        assert row_got == pytest.approx([-math.log(p) for p in row_want], abs=1e-12)


def test_activation_is_hashable_and_frozen() -> None:
    act = parse_activation("elu-0.5")
    assert {act: 1}[Activation("elu", (0.5,))] == 1
    with pytest.raises(AttributeError):
        act.name = "tanh"  # type: ignore[misc]
