# fanout's everyday commands. `just --list` shows them.

# Install fanout with everything the tests, lint and benchmarks use.
setup:
    python -m pip install -q -e '.[dev]'

# The demo: a throttled agent turn against a local server, shown live.
demo *ARGS:
    python -m fanout demo {{ARGS}}

# The test suite (starts its own Redis servers and cluster: see README, Development).
test *ARGS:
    python -m pytest {{ARGS}}

# The test suite under coverage: branch coverage of fanout (the demo aside), 97% at least.
cov *ARGS:
    python -m coverage run -m pytest {{ARGS}}
    python -m coverage report

# Lint, format check and strict typing, as CI runs them.
lint:
    ruff check .
    ruff format --check .
    mypy --strict fanout examples/typed_loop.py

# Every benchmark; writes benchmarks/results/.
bench:
    python -m benchmarks
