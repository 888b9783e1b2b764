from sarathi_lab.report.command import main

main()
