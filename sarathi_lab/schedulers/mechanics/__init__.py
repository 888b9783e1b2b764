"""The mechanics every policy shares, one module each, inherited by `Policy`: admission
(`admit`), preemption by recompute or swap (`preemption`), progress and KV bookkeeping
(`progress`), and the fast-forward opt-in (`fast_forward`). None imports `schedulers.base`:
the contract sits above them."""
