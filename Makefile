# The README's commands. `make run` serves; `make test` runs the whole suite on SQLite and PostgreSQL.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# `make run` installs the service's own dependencies; the test, lint and load tools only when asked for.
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed-dev
# The modules setup.py compiles with mypyc (app/compiled.py's COMPILED_MODULES; a test keeps the two alike):
# an edit rebuilds them before `make run` or `make test` uses them.
COMPILED_SOURCES := app/sizing/hardware/step_scalar.py app/sizing/serving/scheduler.py
COMPILED := $(VENV)/.installed-compiled
HOST ?= 127.0.0.1
PORT ?= 8000
export HOST PORT
# Admin connection used to create and drop the throwaway test database.
PG_ADMIN_URL ?= postgresql://postgres@127.0.0.1:5432/postgres
PYTEST_ARGS ?=
# Every published measurement the project ships (read as one by the validator and the calibrator).
MEASUREMENTS := tests/data/measured-calibration.csv tests/data/measured-calibration-2.csv

.PHONY: run test test-sqlite test-postgres bench openapi lint migrate load-catalog charts accuracy calibrate clean

# Reinstall only when the dependency files change, so a second `make run` starts in seconds.
# --no-compile: Python compiles each module on first import anyway, only those it imports.
# Each install also builds the compiled modules (setup.py), so it leaves them up to date.
$(RUNTIME): pyproject.toml constraints.txt setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -c constraints.txt -e .
	@touch $(RUNTIME) $(COMPILED)

$(DEV): $(RUNTIME)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -c constraints.txt -e '.[dev]'
	@touch $(DEV) $(COMPILED)

# A compiled module's source changed: build the package again (its dependencies are already there).
$(COMPILED): $(RUNTIME) $(COMPILED_SOURCES)
	$(PY) -m pip install -q --disable-pip-version-check --no-compile --no-deps -e .
	@touch $(COMPILED)

venv: $(DEV) $(COMPILED)

migrate: $(RUNTIME) $(COMPILED)
	$(PY) -m alembic upgrade head

load-catalog: migrate
	$(PY) -m app.load_catalog

run: load-catalog
	$(VENV)/bin/uvicorn --factory app.main:create_app --host "$(HOST)" --port "$(PORT)" --no-access-log --no-server-header

# The two suites are independent (each its own database, servers on free ports), so they run side by side,
# one per core; each suite's output is printed whole when it ends, and both always run to their end.
test:
	@$(MAKE) --no-print-directory --keep-going --jobs=2 --output-sync=target test-sqlite test-postgres

test-sqlite: $(DEV) $(COMPILED)
	@echo "== test suite on SQLite =="
	env -u TEST_DATABASE_URL $(PY) -m pytest $(PYTEST_ARGS)

# A throwaway database on the local server; the suite fails (never skips) if PostgreSQL is unusable.
test-postgres: $(DEV) $(COMPILED)
	@echo "== test suite on PostgreSQL =="
	@db=sizing_test_$$$$; admin="$(PG_ADMIN_URL)"; \
	$(PY) scripts/pgdb.py create "$$admin" $$db || exit 1; \
	url="postgresql+psycopg://$${admin#postgresql://}"; \
	TEST_DATABASE_URL="$${url%/*}/$$db" $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	$(PY) scripts/pgdb.py drop "$$admin" $$db; exit $$rc

bench: $(DEV) $(COMPILED)
	$(PY) -m app.bench

openapi: $(RUNTIME)
	$(PY) scripts/export_openapi.py

# docs/ACCURACY.md: the cross-validated error of the shipped default profile, then its error on the data.
accuracy: $(RUNTIME)
	$(PY) -m app.validate $(MEASUREMENTS) --capacity tests/data/measured-capacity.csv --markdown docs/ACCURACY.md

# Refit the shipped default calibration profile (20-28 minutes on two cores, README: one refit per held-out GPU, model
# family and engine; a more specific level ships only where its held-out error is lower beyond sampling noise).
calibrate: $(RUNTIME)
	$(PY) -m app.calibrate $(MEASUREMENTS) --name default

charts: $(RUNTIME)
	$(PY) scripts/render_charts.py

lint: $(DEV)
	$(VENV)/bin/ruff check app tests scripts

clean:
	rm -rf $(VENV) data/*.db build app/compiled-sources.json
	find app -name '*.so' -delete
