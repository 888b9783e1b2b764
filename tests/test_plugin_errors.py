"""Plug-ins that fail are named with their class (issue 35, item 5) and one that cannot be
imported gets a hint about where Python looks (issue 40, item 5)."""
import pytest
from conftest import LinearCost, make_policy

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request
from sarathi_lab.schedulers.controllers.base import BudgetController


class Raises(BudgetController):
    """A controller whose decide() fails (a bug in a user's plug-in)."""

    def decide(self, view, predict):
        return 1 // 0


def test_a_controller_that_raises_is_named_with_its_class():
    p = make_policy("sarathi", token_budget=64, controller="test_plugin_errors:Raises")
    p.bind_predictor(lambda prefills, decodes: 0.01)
    eng = Engine(p, LinearCost(), fast_forward=False)
    eng.add_request(Request(0, 0.0, 20, 2))
    with pytest.raises(Exception) as e:
        eng.step()
    assert "controller test_plugin_errors:Raises: decide() raised ZeroDivisionError: " \
           "integer division or modulo by zero" in str(e.value), e.value
    assert isinstance(e.value.__cause__.__cause__, ZeroDivisionError)
