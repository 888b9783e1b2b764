"""`python -m sarathi_lab.profiler`: the `sarathi-lab-profile` command."""
from sarathi_lab.profiler.command import main

main()
