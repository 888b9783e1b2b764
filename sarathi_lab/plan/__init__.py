"""The deployment planner (`sarathi-lab-plan`, sarathi_lab/docs/planning.md): the cheapest
configurations of a space (hardware x layout x split x policy x budget, replicas searched) that
serve a load within the SLO. Modules, top to bottom: cli (the command), table (ranking, Parquet,
Pareto plot), search (pruning, parallel dispatch, resume), evaluate (one configuration: its
capacity, the fewest replicas, the deployment's capacity), space (the candidates and their
configs), prices (the price table)."""
