# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv and install everything the project needs.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# mypy and import-linter cannot follow setuptools' package-dir mapping, so they
# check a tree of symlinks laid out as the installed package would be.
TYPECHECK_TREE := build/typecheck
# librdkafka 2.12.1's integration suite (from the npm package node-rdkafka 3.6.0), built here.
COMPAT_BUILD := build/compat
COMPAT_STAMP := $(COMPAT_BUILD)/.built-node-rdkafka-3.6.0

.PHONY: demo test lint typecheck imports layout-tree java-check pytest pytest-pure test-under-load bench torture serve-soak eos-soak soak-resources compat clean

# The install builds the compiled append (engine/_append.c -> oncelog._append) in place;
# with no C compiler it goes on without it, and oncelog takes the Python path. The dev extra
# is every other extra (kafka, spark, plot) and the tools of `make test`.
$(STAMP): pyproject.toml build_backend/oncelog_build.py engine/_append.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@$(BIN)/python -c "import oncelog._append" 2>/dev/null \
		&& echo "make: the compiled append is built (oncelog._append)" \
		|| echo "make: no compiled append (no C compiler?): oncelog takes the Python path"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/oncelog demo --data-dir data/demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

layout-tree: $(STAMP)
	rm -rf $(TYPECHECK_TREE) && mkdir -p $(TYPECHECK_TREE)/oncelog
	for f in engine/*; do ln -s "$(CURDIR)/$$f" $(TYPECHECK_TREE)/oncelog/; done
	ln -s "$(CURDIR)/segments" $(TYPECHECK_TREE)/oncelog/segments
	ln -s "$(CURDIR)/recovery" $(TYPECHECK_TREE)/oncelog/recovery

typecheck: layout-tree
	cd $(TYPECHECK_TREE) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p oncelog

# The layer contracts in pyproject.toml ([tool.importlinter]).
imports: layout-tree
	cd $(TYPECHECK_TREE) && PYTHONPATH=. $(CURDIR)/$(BIN)/lint-imports --config $(CURDIR)/pyproject.toml --no-cache

# The Spark tests (tests/spark) start a JVM: PySpark 4 needs Java 17+ ($JAVA_HOME/bin/java, else PATH).
java-check:
	@java="$${JAVA_HOME:+$$JAVA_HOME/bin/}java"; \
	v=$$("$$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' | head -n 1); \
	set -- $$v; major=$${1:-0}; [ "$$major" = 1 ] && major=$${2:-0}; \
	if [ "$$major" -lt 17 ]; then \
		found=$${v:+Java $$major}; \
		echo "make: the Spark tests need Java 17+, found $${found:-no java} ($$java); install openjdk-17-jre-headless or set JAVA_HOME" >&2; \
		exit 1; \
	fi

# npm downloads the package (no Node build); a C compiler builds librdkafka and its runner.
$(COMPAT_STAMP): $(STAMP) tests/compat/build_librdkafka.sh
	PIP=$(CURDIR)/$(BIN)/pip bash tests/compat/build_librdkafka.sh $(COMPAT_BUILD)

# Two workers (a 2-core machine's cores): each test module is one unit of work, a few heavy
# tests one each, heaviest first (tests/conftest.py, tests/work_units.py). PYTEST_WORKERS=0:
# one process.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder

pytest: $(STAMP) java-check $(COMPAT_STAMP)
	$(BIN)/python -m pytest $(XDIST) --durations=30

# The engine's and the codec's tests again on the Python append path (the reference and
# the fallback); the suite above runs the compiled one, and compares the two step by step.
pytest-pure: $(STAMP)
	ONCELOG_PURE=1 $(BIN)/python -m pytest $(XDIST) tests/engine tests/segments -q

test: lint typecheck imports pytest pytest-pure

# The suite with two busy processes beside it, as on CI's shared machine: no test may
# depend on how fast the machine is. Not part of `make test` (it takes longer).
test-under-load: $(STAMP) java-check $(COMPAT_STAMP)
	@hogs=""; \
	for n in 1 2; do $(BIN)/python -c 'while True: pass' & hogs="$$hogs $$!"; done; \
	trap 'kill $$hogs 2>/dev/null' EXIT INT TERM; \
	echo "make: two CPU hogs running (pids$$hogs)"; \
	$(MAKE) --no-print-directory pytest pytest-pure

bench: $(STAMP)
	$(BIN)/python -m pytest bench --benchmark-only --benchmark-columns=median,ops,rounds

# A long soak of the crash torture harness (the bounded run is part of `make test`).
torture: $(STAMP)
	$(BIN)/oncelog torture --seed $${SEED:-$$(date +%s)} --crashes $${CRASHES:-20000}

# A long soak of the kill -9 end-to-end test of `oncelog serve` (the short run is part of `make test`);
# ONCELOG_KILL9_SEED=... replays the kill moments of a printed seed.
serve-soak: $(STAMP)
	ONCELOG_KILL9_MESSAGES=20000 ONCELOG_KILL9_KILLS=8 $(BIN)/python -m pytest tests/server/test_kill9_end_to_end.py -q -s

# The long exactly-once run through `oncelog serve`: a consume-transform-produce app over 50,000
# inputs while the server and the app are each SIGKILLed 4 times (ONCELOG_EOS_SEED=... replays one).
eos-soak: $(STAMP)
	ONCELOG_EOS_MESSAGES=50000 ONCELOG_EOS_KILLS=4 $(BIN)/python -m pytest tests/server/test_eos_end_to_end.py -q -s

# Descriptors and memory of `oncelog serve` over 10 minutes (issue 28): 1,000 partitions rolling a
# segment every few seconds, idempotent producers and a consumer group; samples every 10 s, plots
# bench/soak_resources.png, fails if descriptors grow after the warm-up or a message is lost or
# duplicated. SOAK_SECONDS=180 (say) for a shorter run; bench/soak_resources.py lists the knobs.
soak-resources: $(STAMP)
	SOAK_SECONDS=$${SOAK_SECONDS:-600} $(BIN)/python bench/soak_resources.py

# Every test of librdkafka's integration suite meant for a real cluster, against `oncelog serve`
# (issue 31; `make test` runs a fast subset). Allowlist: tests/compat/librdkafka_allowlist.txt.
# TESTS=0012,0030 (say) runs those numbers only; SECURITY=sasl_ssl runs them over SASL_SSL
# with SCRAM-SHA-512 and ACLs; the summary is written to build/compat/result.json.
compat: $(STAMP) $(COMPAT_STAMP)
	$(BIN)/python tests/compat/librdkafka_suite.py --build $(COMPAT_BUILD) --tests $${TESTS:-all} \
		--security $${SECURITY:-plaintext} \
		--json $(COMPAT_BUILD)/result.json

clean:
	rm -rf $(VENV) build dist data .pytest_cache .mypy_cache .ruff_cache .hypothesis .benchmarks
