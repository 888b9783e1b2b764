"""`static`: every iteration's budget is ``scheduler.token_budget`` (Sarathi-Serve's fixed chunk
size). The default; the policy then builds no view and keeps its fast-forward, so a run is the
same as before controllers existed (a test compares them)."""
from sarathi_lab.schedulers.controllers.base import BudgetController, Decision


class Static(BudgetController):
    name = "static"

    def decide(self, view, predict):
        return Decision(view.max_budget)
