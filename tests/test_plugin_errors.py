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
        eng.advance()
    assert "controller test_plugin_errors:Raises: decide() raised ZeroDivisionError: " \
           "integer division or modulo by zero" in str(e.value), e.value
    assert isinstance(e.value.__cause__.__cause__, ZeroDivisionError)


def test_a_plugin_module_not_found_gets_a_hint_about_pythonpath():
    from helpers import composed

    from sarathi_lab.run.config import resolve
    from sarathi_lab.settings import ConfigError
    with pytest.raises(ConfigError) as e:
        resolve(composed("scheduler=custom", "scheduler.name=no_such_policy_module:Mine"))
    assert str(e.value).startswith(
        "scheduler.name: cannot load scheduler 'no_such_policy_module:Mine': No module named "
        "'no_such_policy_module' (Python finds a plug-in module on PYTHONPATH: for "
        "no_such_policy_module.py in the current folder, run PYTHONPATH=$PWD sarathi-lab"), e.value
    # a module found that fails to import something of its own gets no such hint
    with pytest.raises(ConfigError) as e:
        resolve(composed("scheduler=custom", "scheduler.name=plugin_policy:NoSuchClass"))
    assert "PYTHONPATH" not in str(e.value)
