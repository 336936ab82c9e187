"""fanout's benchmarks: fanout against the ways people fan out tool calls today.

``python -m benchmarks`` (or ``just bench``) runs everything and writes the
tables, timelines and raw numbers under ``benchmarks/results/``; ``--quick``
is a much smaller run. ``benchmarks/README.md`` says how to read them.

Modules, read top-down: ``scenarios`` (the workloads and their theoretical
minimum), ``harness`` (the throttling server in its own process, request
recording, result records), ``strategies`` (the seven ways to run the calls),
``bench_strategies``, ``bench_overhead`` and ``bench_deadline`` (the
measurements), ``report`` (markdown and PNG).
"""
