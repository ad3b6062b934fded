"""``jit-run`` itself: what runs outside the training processes.

- ``cli``: the entry point and its subcommands (``plan``, ``doctor``, ``emulator-path``);
- ``launcher``: checks a job's inputs, sets up the workers' environment, runs the agent, prints the report;
- ``agent``: torchrun's elastic agent with jit-run's patches (save grace, frozen workers, event log);
- ``report``: the recovery report, built from the job's event log.
"""
