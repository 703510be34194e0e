"""The command-line tools and what they are built from: `ascmem` (cli),
`ascmem plan` (cli_plan over planner), `ascmem bench` (bench), plots (plot)
and progress bars on a terminal (progress)."""
