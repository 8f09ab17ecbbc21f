# Two commands for a fresh machine (Python 3.11, make):
#   make run    set up .venv and run `twistd -n eventbus` (127.0.0.1:5556-5558, log in ./eventbus-data)
#   make test   set up .venv with test and Spark extras (and .venv-interop with the real
#               eventmq), build the sdist and the wheel, install the wheel into two venvs
#               outside the checkout (every extra, none), and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
ARGS ?=

.PHONY: run test dist lint docs bench clean browser redis-server prometheus cluster nemesis nemesis-emqp nemesis-dbp nemesis-mc0 nemesis-emqp-pubsub alerts-yml

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setup.py builds the optional C helpers (bus/transport/_frames.c, bus/nats/_scan.c) in place;
# bus/__init__.py holds the version that the installed metadata carries.
$(VENV)/.run-deps: setup.cfg setup.py pyproject.toml bus/__init__.py bus/transport/_frames.c bus/nats/_scan.c \
		bus/eventbus/_pubscan.c bus/util/_sqlrows.c bus/emqp/_jobscan.c \
		| $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The tests also run a third-party service, examples/echo-service, installed as its own
# distribution (it declares itself in the bus.services entry point group).
$(VENV)/.test-deps: setup.cfg setup.py pyproject.toml bus/__init__.py bus/transport/_frames.c bus/nats/_scan.c \
		bus/eventbus/_pubscan.c bus/util/_sqlrows.c bus/emqp/_jobscan.c \
		examples/echo-service/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,lint,spark,cluster,redis]"
	$(BIN)/python -m pip install --quiet --no-deps -e examples/echo-service
	touch $@ $(VENV)/.run-deps

# What users install: the sdist and the wheel built from it (PyPA's build), checked by twine.
# tests/test_installed_*.py run the product from this wheel, installed into two venvs outside
# the checkout (WHEEL_HOME): one with every extra, one bare (what `pip install bus` gives).
DIST ?= dist
WHEEL_HOME ?= $(or $(TMPDIR),/tmp)/bus-wheel-$(shell printf %s "$(CURDIR)" | cksum | cut -d' ' -f1)
DIST_SOURCES := $(shell find bus twisted -name __pycache__ -prune -o -type f \
	\( -name '*.py' -o -name '*.c' -o -name '*.html' -o -name '*.css' -o -name '*.js' \
	-o -name py.typed \) -print) setup.cfg setup.py pyproject.toml MANIFEST.in README.md \
	CHANGELOG.md LICENSE

$(DIST)/.built: $(DIST_SOURCES) | $(VENV)/.test-deps
	rm -rf $(DIST) build
	$(BIN)/python -m build --outdir $(DIST) . > $(VENV)/build.log 2>&1 \
		|| { cat $(VENV)/build.log; exit 1; }
	$(BIN)/twine check --strict $(DIST)/*
	touch $@

dist: $(DIST)/.built

# A venv is made once; each new wheel replaces the installed one (pip removes every file
# the old one installed), and its extras' requirements are brought up to date.
$(WHEEL_HOME)/%/.installed: $(DIST)/.built
	test -x $(WHEEL_HOME)/$*/bin/python || $(PYTHON) -m venv $(WHEEL_HOME)/$*
	$(WHEEL_HOME)/$*/bin/python -m pip install --quiet --upgrade pip
	$(WHEEL_HOME)/$*/bin/python -m pip install --quiet --force-reinstall --no-deps $(DIST)/*.whl
	$(WHEEL_HOME)/$*/bin/python -m pip install --quiet \
		"$$(ls $(DIST)/*.whl)$(if $(filter full,$*),$(FULL_EXTRAS))"
	touch $@

FULL_EXTRAS = [cluster,spark,redis]
INSTALLED = $(WHEEL_HOME)/full/.installed $(WHEEL_HOME)/bare/.installed

# The real eventmq 0.3.13 for the eMQP interoperability tests, in its own venv: it pins
# pyzmq 18.1.0, which does not build on this Python, so it goes in without its pins (redis:
# its scheduler keeps schedules in Redis, which `emqp-cli schedules import` reads).
INTEROP ?= .venv-interop
$(INTEROP)/.installed: Makefile
	$(PYTHON) -m venv $(INTEROP)
	$(INTEROP)/bin/python -m pip install --quiet --no-deps eventmq==0.3.13
	$(INTEROP)/bin/python -m pip install --quiet "pyzmq>=25,<28" "six>=1.14,<2" monotonic==0.4 \
		croniter==0.3.10 psutil "future>=0.18.3" "redis>=5,<9"
	touch $@

# The console's browser tests drive Debian's Chromium and its driver: installed here when
# missing, where this user may (root, apt-get); elsewhere a note says what to install.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium and chromium-driver for the browser tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q chromium chromium-driver >/dev/null; }; \
	else echo "note: the browser tests need chromium and chromium-driver (apt-get install" \
		"chromium chromium-driver); without them they are skipped"; fi

# The import of eventmq's schedules (tests/test_emqp_import.py) runs Debian's redis-server:
# installed here when missing, where this user may (root, apt-get); elsewhere a note.
redis-server:
	@if command -v redis-server >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's redis-server for the eventmq schedule import tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q redis-server >/dev/null; }; \
	else echo "note: the schedule import tests need redis-server (apt-get install" \
		"redis-server); without it they are skipped"; fi

# The Prometheus tests (tests/test_prometheus.py: promtool on /metrics and the alert rules,
# a real server scraping the product) run Debian's prometheus: installed here when missing,
# where this user may (root, apt-get); elsewhere a note. Without its recommended node
# exporter; under systemd the package starts its own server on :9090 (`systemctl disable
# --now prometheus` if that is not wanted): the tests run theirs.
prometheus:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's prometheus (server and promtool) for the Prometheus tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; \
	else echo "note: the Prometheus tests need prometheus and promtool (apt-get install" \
		"prometheus); without them they are skipped"; fi

run: $(VENV)/.run-deps
	$(BIN)/twistd -n eventbus $(ARGS)

# Three NATS servers and two Event BUS front-ends of one JetStream stream, on this machine
# (docs/cluster.md); Ctrl-C stops them.
$(VENV)/.cluster-deps: $(VENV)/.run-deps
	$(BIN)/python -m pip install --quiet -e ".[cluster]"
	touch $@

cluster: $(VENV)/.cluster-deps
	$(BIN)/bus-cluster $(ARGS)

# The JetStream nemesis test at length (root: it makes network namespaces).
nemesis: $(VENV)/.test-deps
	NEMESIS_ROUNDS=$${NEMESIS_ROUNDS:-24} $(BIN)/python -m pytest -s -p no:cacheprovider tests/test_eventbus_nemesis.py

# The eMQP JetStream nemesis at length (root: network namespaces; eventmq's own job manager
# and client from its venv; the Spark pipeline reading an Event BUS front-end's stream on the
# same nats-servers). make test runs it with 4 rounds. NEMESIS_SEED=N replays a run's faults.
nemesis-emqp: $(VENV)/.test-deps $(INTEROP)/.installed
	NEMESIS_ROUNDS=$${NEMESIS_ROUNDS:-15} $(BIN)/python -m pytest -s -p no:cacheprovider tests/test_emqp_nemesis.py

# The mc0 nemesis at length (root: network namespaces): brokers on three nats-servers, clients
# given both brokers. make test runs it with 4 rounds. NEMESIS_SEED=N replays a run's faults.
nemesis-mc0: $(VENV)/.test-deps
	NEMESIS_ROUNDS=$${NEMESIS_ROUNDS:-16} $(BIN)/python -m pytest -s -p no:cacheprovider tests/test_mc0_nemesis.py

# The nemesis of eMQP's PUBLISH service across brokers at length (root: network namespaces):
# brokers on three nats-servers, publishers and subscribers at each, rounds of faults.
nemesis-emqp-pubsub: $(VENV)/.test-deps
	NEMESIS_ROUNDS=$${NEMESIS_ROUNDS:-16} $(BIN)/python -m pytest -s -p no:cacheprovider tests/test_emqp_pubsub_nemesis.py

# The DBP nemesis at length (root: network namespaces): shared catalog instances killed,
# stopped, cut, and nats-servers killed, under Hermes' clients and a heartbeating service.
nemesis-dbp: $(VENV)/.test-deps
	DBP_NEMESIS_ROUNDS=$${DBP_NEMESIS_ROUNDS:-12} $(BIN)/python -m pytest -s -p no:cacheprovider tests/test_dbp_nemesis.py

# The longest files first, in tests/conftest.py's LONGEST_FIRST order (--no-loadscope-reorder).
# The class archive every JVM of the tests maps (tests/jvm_archive.py): half their start-up CPU.
# Without it (not built here: said, with its log's end) the JVMs start as before.
$(VENV)/spark-classes.jsa: $(VENV)/.test-deps tests/jvm_archive.py tests/jvm.py
	$(BIN)/python -m tests.jvm_archive $@ 2>$(VENV)/spark-classes.log \
		|| { tail -20 $(VENV)/spark-classes.log; \
		     echo "no class archive for the tests' JVMs: they start without it"; }

# Two test files per core: half the suite's time is spent waiting (nemesis rounds, elections,
# timeouts a test proves), which a second file per core fills.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))

test: $(VENV)/.test-deps $(VENV)/spark-classes.jsa $(INTEROP)/.installed $(INSTALLED) browser redis-server prometheus
	BUS_DIST=$(abspath $(DIST)) BUS_WHEEL_VENV=$(WHEEL_HOME)/full BUS_BARE_VENV=$(WHEEL_HOME)/bare \
		$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: $(VENV)/.test-deps
	$(BIN)/ruff check bus tests bench examples
	$(BIN)/ruff format --check bus tests bench examples
	$(BIN)/mypy bus tests/contract_check.py
	$(BIN)/mypy examples/echo-service/echo_service

# The API reference in build/apidocs (index.html); a broken cross-reference or a docstring
# that does not parse fails it.
docs: $(VENV)/.test-deps
	$(BIN)/pydoctor --quiet --warnings-as-errors --project-name=bus \
		--docformat=restructuredtext \
		--html-output=build/apidocs bus

# docs/prometheus/alerts.yml from its one definition, bus/web/alerts/rules.py (the console
# evaluates the same rules; tests/test_alert_rules.py fails when the two differ).
alerts-yml:
	$(BIN)/python -m bus.web.alerts.rules > docs/prometheus/alerts.yml.new
	mv docs/prometheus/alerts.yml.new docs/prometheus/alerts.yml

bench: $(VENV)/.run-deps
	@echo "see bench/README.md"

clean:
	rm -rf $(VENV) $(INTEROP) $(DIST) $(WHEEL_HOME) build *.egg-info
